package host

// SetUnpaged sets the byte budget and the chunk size of List answers
// without max_entries, for the tests of the package's external test
// package, and returns what restores them.
func SetUnpaged(budget, chunk int) (restore func()) {
	oldBudget, oldChunk := unpagedBudget, unpagedChunk
	unpagedBudget, unpagedChunk = budget, chunk
	return func() { unpagedBudget, unpagedChunk = oldBudget, oldChunk }
}
