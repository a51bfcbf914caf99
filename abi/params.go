package abi

import (
	"strconv"
	"strings"
)

// COParameterPrefix starts the keys the CO adds to StorageClass parameters
// and volume contexts itself (csi.storage.k8s.io/pvc/name, ...): a
// declared parameter list never refuses them.
const COParameterPrefix = "csi.storage.k8s.io/"

// CheckParameters checks params against the declared specs as the host
// does for a module whose BackendInfo.DeclaresParameters is set: an
// unknown key, or a value Check refuses, is INVALID_ARGUMENT naming the
// key. Keys are checked in sorted order, so the error names the first.
func CheckParameters(specs []ParameterSpec, params map[string]string) error {
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sortStrings(keys)
	for _, k := range keys {
		if strings.HasPrefix(k, COParameterPrefix) {
			continue
		}
		spec, ok := findSpec(specs, k)
		if !ok {
			names := make([]string, len(specs))
			for i, s := range specs {
				names[i] = s.Name
			}
			known := "none"
			if len(names) > 0 {
				known = strings.Join(names, ", ")
			}
			return &Error{Code: InvalidArgument, Message: "unknown parameter " + strconv.Quote(k) + " (known: " + known + ")"}
		}
		if err := spec.Check(params[k]); err != nil {
			return err
		}
	}
	return nil
}

func findSpec(specs []ParameterSpec, name string) (ParameterSpec, bool) {
	for _, s := range specs {
		if s.Name == name {
			return s, true
		}
	}
	return ParameterSpec{}, false
}

// Check refuses a value of the wrong type or not in Allowed with
// INVALID_ARGUMENT naming the parameter.
func (s ParameterSpec) Check(value string) error {
	bad := func(why string) error {
		return &Error{Code: InvalidArgument, Message: "parameter " + strconv.Quote(s.Name) + ": " + strconv.Quote(value) + " " + why}
	}
	switch s.Type {
	case "", ParamString:
	case ParamBool:
		// What strconv.ParseBool takes, as the modules read these values
		// before the host checked them ("True", "1", "f" and so on).
		if _, err := strconv.ParseBool(value); err != nil {
			return bad("is not a boolean (true or false)")
		}
	case ParamInt:
		if _, err := strconv.ParseInt(value, 10, 64); err != nil {
			return bad("is not a decimal integer")
		}
	case ParamQuantity:
		if _, ok := ParseQuantity(value); !ok {
			return bad("is not a byte count (digits, optionally Ki, Mi, Gi or Ti)")
		}
	default:
		return &Error{Code: Internal, Message: "parameter " + strconv.Quote(s.Name) + " is declared with unknown type " + strconv.Quote(s.Type)}
	}
	if len(s.Allowed) > 0 {
		for _, a := range s.Allowed {
			if a == value {
				return nil
			}
		}
		return bad("is not one of " + strings.Join(s.Allowed, ", "))
	}
	return nil
}

// ParseQuantity reads a byte count: decimal digits with an optional
// binary suffix Ki, Mi, Gi or Ti.
func ParseQuantity(s string) (int64, bool) {
	mult := int64(1)
	for i, suf := range []string{"Ki", "Mi", "Gi", "Ti"} {
		if strings.HasSuffix(s, suf) {
			mult, s = int64(1)<<(10*(i+1)), strings.TrimSuffix(s, suf)
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<63-1)/mult {
		return 0, false
	}
	return n * mult, true
}

// sortStrings is an insertion sort: abi avoids importing sort for guests.
func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
