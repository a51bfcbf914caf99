# Sourced by the tiers (.ci/sanity.sh, .ci/nomad/test.sh, .ci/k8s/test.sh):
# what each run left below its own folder $work, for its teardown.

# mounts_under lists mount points at or below $work, deepest first.
mounts_under() {
	awk -v w="$work" '$5 == w || index($5, w "/") == 1 { print length($5) "\t" $5 }' /proc/self/mountinfo |
		sort -rn | cut -f2-
}

# loops_on_work lists loop devices whose backing file lies below $work.
loops_on_work() {
	local f b
	for f in /sys/block/loop*/loop/backing_file; do
		[ -r "$f" ] || continue
		b=$(cat "$f")
		case "$b" in "$work"/*) f=${f#/sys/block/}; echo "/dev/${f%%/*}" ;; esac
	done
}
