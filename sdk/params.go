package sdk

import (
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
)

// ParameterTable renders declared StorageClass parameters
// (abi.BackendInfo.Parameters) as the Markdown table a module's README
// shows; wasmcsi modules inspect prints the same from a built module.
func ParameterTable(specs []abi.ParameterSpec) string {
	if len(specs) == 0 {
		return "No StorageClass parameters: any key other than the CO's own (csi.storage.k8s.io/...) is INVALID_ARGUMENT.\n"
	}
	var b strings.Builder
	b.WriteString("| parameter | type | default | allowed | mutable | what |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, s := range specs {
		typ := s.Type
		if typ == "" {
			typ = abi.ParamString
		}
		allowed := "any"
		if len(s.Allowed) > 0 {
			allowed = "`" + strings.Join(s.Allowed, "`, `") + "`"
		}
		mutable := "no"
		if s.Mutable {
			mutable = "yes"
		}
		def := s.Default
		if s.DefaultNote != "" {
			def = s.DefaultNote
		}
		if def == "" {
			def = "—"
		}
		for _, cell := range []string{"`" + s.Name + "`", typ, def, allowed, mutable, s.Description} {
			b.WriteString("| ")
			b.WriteString(strings.ReplaceAll(cell, "|", "\\|"))
			b.WriteString(" ")
		}
		b.WriteString("|\n")
	}
	return b.String()
}

// ParameterValue returns the value of the declared parameter spec in
// params, or its Default when absent. A module whose BackendInfo
// DeclaresParameters gets only values the host checked against spec. It
// never returns prose: a Default that is not a value of the spec's type
// (documentation belongs in DefaultNote) reads as "", as does an absent
// parameter without a Default, so the caller falls back to its own rule.
func ParameterValue(params map[string]string, spec abi.ParameterSpec) string {
	if v, ok := params[spec.Name]; ok {
		return v
	}
	if spec.Default == "" || spec.Check(spec.Default) != nil {
		return ""
	}
	return spec.Default
}
