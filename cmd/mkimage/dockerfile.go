package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"regexp"
	"strings"
)

// runtime is what the final stage of deploy/Dockerfile puts in the image:
// the Debian base, the packages installed on it, the files removed after,
// the files copied from the build stage, and the entrypoint and command.
type runtime struct {
	Suite      string   // bookworm, from FROM debian:<suite>-slim
	Packages   []string // apt-get install ... (no recommends)
	Remove     []string // rm -f paths after the install
	Copies     []copyOp // COPY --from=build
	Entrypoint []string
	Cmd        []string
}

// copyOp is one COPY --from=build SRC DST: SRC a file or a folder (with a
// trailing slash) of the build stage's /out.
type copyOp struct{ Src, Dst string }

var fromSlim = regexp.MustCompile(`^debian:([a-z]+)-slim$`)

// parseDockerfile reads the final stage of a Dockerfile written the way
// deploy/Dockerfile is. Anything it does not understand in that stage is
// an error: the image built without Docker must not silently differ from
// the one Docker builds.
func parseDockerfile(r io.Reader) (*runtime, error) {
	lines, err := logicalLines(r)
	if err != nil {
		return nil, err
	}
	var rt *runtime
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		instr = strings.ToUpper(instr)
		rest = strings.TrimSpace(rest)
		if instr == "FROM" {
			rt = nil
			f := strings.Fields(rest)
			if len(f) == 1 {
				m := fromSlim.FindStringSubmatch(f[0])
				if m == nil {
					return nil, fmt.Errorf("final stage FROM %s: want debian:<suite>-slim", f[0])
				}
				rt = &runtime{Suite: m[1]}
			}
			continue
		}
		if rt == nil {
			continue // a build stage
		}
		switch instr {
		case "RUN":
			if err := rt.run(rest); err != nil {
				return nil, err
			}
		case "COPY":
			f := strings.Fields(rest)
			if len(f) != 3 || f[0] != "--from=build" || !strings.HasPrefix(f[1], "/out/") {
				return nil, fmt.Errorf("COPY %s: want COPY --from=build /out/... DST", rest)
			}
			rt.Copies = append(rt.Copies, copyOp{Src: strings.TrimPrefix(f[1], "/out/"), Dst: f[2]})
		case "ENTRYPOINT", "CMD":
			var v []string
			if err := json.Unmarshal([]byte(rest), &v); err != nil {
				return nil, fmt.Errorf("%s %s: want the JSON form: %v", instr, rest, err)
			}
			if instr == "CMD" {
				rt.Cmd = v
			} else {
				rt.Entrypoint = v
			}
		default:
			return nil, fmt.Errorf("final stage: %s is not understood by the image builder", instr)
		}
	}
	if rt == nil {
		return nil, fmt.Errorf("no final stage FROM debian:<suite>-slim")
	}
	if len(rt.Packages) == 0 || len(rt.Entrypoint) == 0 {
		return nil, fmt.Errorf("final stage without packages or entrypoint")
	}
	return rt, nil
}

// run understands one RUN of the final stage: commands joined by &&, each
// an apt-get update, an apt-get install -y --no-install-recommends, an
// rm -f of paths, or the rm -rf of apt's lists.
func (rt *runtime) run(s string) error {
	for _, c := range strings.Split(s, "&&") {
		f := strings.Fields(c)
		switch {
		case len(f) == 2 && f[0] == "apt-get" && f[1] == "update":
		case len(f) > 4 && f[0] == "apt-get" && f[1] == "install" && f[2] == "-y" && f[3] == "--no-install-recommends":
			for _, p := range f[4:] {
				if strings.HasPrefix(p, "-") {
					return fmt.Errorf("RUN apt-get install: option %s is not understood", p)
				}
				rt.Packages = append(rt.Packages, p)
			}
		case len(f) == 3 && f[0] == "rm" && f[1] == "-rf" && f[2] == "/var/lib/apt/lists/*":
			// mmdebstrap leaves no lists either.
		case len(f) > 2 && f[0] == "rm" && f[1] == "-f":
			for _, p := range f[2:] {
				if !path.IsAbs(p) || strings.ContainsAny(p, "*?[") {
					return fmt.Errorf("RUN rm -f %s: want absolute paths without patterns", p)
				}
				rt.Remove = append(rt.Remove, p)
			}
		default:
			return fmt.Errorf("RUN %q is not understood by the image builder", strings.TrimSpace(c))
		}
	}
	return nil
}

// logicalLines joins continuation lines and drops comments and blank lines.
func logicalLines(r io.Reader) ([]string, error) {
	var out []string
	var cur strings.Builder
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || (l == "" && cur.Len() == 0) {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\"))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(l)
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, strings.TrimSpace(cur.String()))
	}
	return out, sc.Err()
}
