package oci

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/wasmcsi/wasmcsi/abi"
)

var wasmHeader = []byte("\x00asm\x01\x00\x00\x00")

// RequestedFamilies lists, sorted, the host-call families a module's
// imports need granted. It reads the import section only, without
// compiling: a module that asks for more than its grant is refused before
// any of its code is compiled.
func RequestedFamilies(data []byte) ([]string, error) {
	if !bytes.HasPrefix(data, wasmHeader) {
		return nil, errors.New("not a WebAssembly module (version 1)")
	}
	family := map[string]string{}
	for _, d := range abi.HostCalls {
		family[d.Name] = d.Family
	}
	var out []string
	r := reader{b: data[len(wasmHeader):]}
	for len(r.b) > 0 && r.err == nil {
		id := r.byte()
		size := r.uint()
		if r.err != nil || uint64(len(r.b)) < size {
			return nil, errors.New("a section runs past the end of the module")
		}
		body := reader{b: r.b[:size]}
		r.b = r.b[size:]
		if id != 2 { // the import section
			continue
		}
		for n := body.uint(); n > 0 && body.err == nil; n-- {
			mod, name := body.name(), body.name()
			switch kind := body.byte(); kind {
			case 0: // function: type index
				body.uint()
			case 1: // table: reference type, limits
				body.byte()
				body.limits()
			case 2: // memory: limits
				body.limits()
			case 3: // global: value type, mutability
				body.byte()
				body.byte()
			case 4: // tag: attribute, type index
				body.byte()
				body.uint()
			default:
				return nil, fmt.Errorf("import %s.%s has unknown kind %d", mod, name, kind)
			}
			if fam, ok := family[name]; ok && mod == abi.HostModule && !slices.Contains(out, fam) {
				out = append(out, fam)
			}
		}
		if body.err != nil {
			return nil, fmt.Errorf("import section: %w", body.err)
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	slices.Sort(out)
	return out, nil
}

// reader decodes the module's LEB128 integers and names, remembering the
// first error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail() {
	if r.err == nil {
		r.err = errors.New("truncated")
	}
	r.b = nil
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		r.fail()
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) uint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) name() string {
	n := r.uint()
	if uint64(len(r.b)) < n {
		r.fail()
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *reader) limits() {
	flags := r.byte()
	r.uint()
	if flags&1 != 0 {
		r.uint()
	}
}
