// Package records holds sample messages of the field types durable records
// add to the ABI's (times, lists of string maps, maps of messages by key),
// generated with -utf8 as host/state is. It must never be imported outside
// wiregen's tests.
package records

import "time"

// Name is a named string type.
type Name string

// Record has one field of each kind, and every kind that holds strings.
type Record struct {
	ID       Name                `wire:"1"`
	At       time.Time           `wire:"2"`
	Segments []map[string]string `wire:"3"`
	Members  map[string]Member   `wire:"4"`
	Tags     []string            `wire:"5"`
	Labels   map[string]string   `wire:"6"`
	Main     Member              `wire:"7"`
	Spare    *Member             `wire:"8"`
	List     []Member            `wire:"9"`
	Ptrs     []*Member           `wire:"10"`
	Count    int64               `wire:"11"`
}

// Member is a map value: its field numbers start at 2, since a map entry
// keeps its key in field 1.
type Member struct {
	Role    string            `wire:"2"`
	Since   time.Time         `wire:"3"`
	Context map[string]string `wire:"4"`
}

// Counter holds no strings.
type Counter struct {
	N int64 `wire:"1"`
}
