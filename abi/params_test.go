package abi_test

import (
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestCheckParameters(t *testing.T) {
	specs := []abi.ParameterSpec{
		{Name: "maxVolumes", Type: abi.ParamInt, Default: "100"},
		{Name: "prealloc", Type: abi.ParamBool},
		{Name: "size", Type: abi.ParamQuantity},
		{Name: "tier", Allowed: []string{"fast", "slow"}},
	}
	for _, tc := range []struct {
		params map[string]string
		want   string // "" for success, else a part of the INVALID_ARGUMENT message
	}{
		{nil, ""},
		{map[string]string{"maxVolumes": "3", "prealloc": "true", "size": "4Gi", "tier": "fast"}, ""},
		{map[string]string{"csi.storage.k8s.io/pvc/name": "x"}, ""},
		{map[string]string{"maxVolume": "3"}, `unknown parameter "maxVolume" (known: maxVolumes, prealloc, size, tier)`},
		{map[string]string{"maxVolumes": "many"}, `parameter "maxVolumes": "many" is not a decimal integer`},
		{map[string]string{"prealloc": "yes"}, `"yes" is not a boolean`},
		// The spellings the modules accepted before the host checked them.
		{map[string]string{"prealloc": "True"}, ""},
		{map[string]string{"prealloc": "1"}, ""},
		{map[string]string{"prealloc": "F"}, ""},
		{map[string]string{"size": "4GB"}, "is not a byte count"},
		{map[string]string{"tier": "medium"}, "is not one of fast, slow"},
	} {
		err := abi.CheckParameters(specs, tc.params)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.params, err)
		case tc.want != "" && (abi.CodeOf(err) != abi.InvalidArgument || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want INVALID_ARGUMENT with %q", tc.params, err, tc.want)
		}
	}
	if err := abi.CheckParameters(nil, map[string]string{"x": "1"}); abi.CodeOf(err) != abi.InvalidArgument || !strings.Contains(err.Error(), "known: none") {
		t.Errorf("no parameters declared: %v", err)
	}
}
