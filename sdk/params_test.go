package sdk

import (
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

// ParameterValue yields values, never the documentation of a default.
func TestParameterValueNeverProse(t *testing.T) {
	for _, tc := range []struct {
		spec   abi.ParameterSpec
		params map[string]string
		want   string
	}{
		{abi.ParameterSpec{Name: "p", Type: abi.ParamBool, Default: "true"}, nil, "true"},
		{abi.ParameterSpec{Name: "p", Type: abi.ParamBool, Default: "true"}, map[string]string{"p": "false"}, "false"},
		{abi.ParameterSpec{Name: "p", Type: abi.ParamBool, DefaultNote: "the config's prealloc (false)"}, nil, ""},
		// A module built before DefaultNote put prose in Default.
		{abi.ParameterSpec{Name: "p", Type: abi.ParamBool, Default: "the config's prealloc (false)"}, nil, ""},
		{abi.ParameterSpec{Name: "n", Type: abi.ParamInt, Default: "about ten"}, nil, ""},
		{abi.ParameterSpec{Name: "s", Default: "fast", Allowed: []string{"fast", "slow"}}, nil, "fast"},
		{abi.ParameterSpec{Name: "s", Default: "whatever suits", Allowed: []string{"fast", "slow"}}, nil, ""},
	} {
		if got := ParameterValue(tc.params, tc.spec); got != tc.want {
			t.Errorf("%+v with %v: %q, want %q", tc.spec, tc.params, got, tc.want)
		}
	}
}

// The table shows DefaultNote where there is one.
func TestParameterTableShowsDefaultNote(t *testing.T) {
	table := ParameterTable([]abi.ParameterSpec{{Name: "p", Type: abi.ParamBool, DefaultNote: "the config's prealloc (false)"}})
	if !strings.Contains(table, "| the config's prealloc (false) |") {
		t.Errorf("table:\n%s", table)
	}
}
