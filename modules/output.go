package modules

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
)

// Bounds of captured guest output.
const (
	stderrTail = 4 << 10 // stderr kept per call, attached to trap errors
	maxLine    = 4 << 10 // a longer line without newline is logged in pieces
)

// guestOutput is one instance's stdout or stderr: it logs whole lines with
// the module's name and the running operation and, for stderr, keeps the last
// stderrTail bytes written during the current call. Only the goroutine
// running the instance's call writes to it.
type guestOutput struct {
	log      *slog.Logger
	inst     *instance
	stream   string
	level    slog.Level
	keepTail bool
	line     []byte
	buf      []byte // recent output, trimmed to stderrTail when read
}

func newGuestOutput(log *slog.Logger, inst *instance, stream string, level slog.Level, keepTail bool) *guestOutput {
	return &guestOutput{log: log, inst: inst, stream: stream, level: level, keepTail: keepTail}
}

func (g *guestOutput) Write(p []byte) (int, error) {
	if g.keepTail {
		g.buf = append(g.buf, p...)
		if len(g.buf) > 2*stderrTail {
			g.buf = append(g.buf[:0], g.buf[len(g.buf)-stderrTail:]...)
		}
	}
	rest := p
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			g.line = append(g.line, rest...)
			if len(g.line) >= maxLine {
				g.flush()
			}
			break
		}
		g.line = append(g.line, rest[:i]...)
		g.emit()
		rest = rest[i+1:]
	}
	return len(p), nil
}

// flush logs a pending partial line.
func (g *guestOutput) flush() {
	if len(g.line) > 0 {
		g.emit()
	}
}

func (g *guestOutput) emit() {
	line := strings.ToValidUTF8(string(g.line), "\uFFFD")
	g.line = g.line[:0]
	g.log.Log(context.Background(), g.level, line, "stream", g.stream, "op", g.inst.op)
}

// reset forgets the tail at the start of a call.
func (g *guestOutput) reset() { g.buf = g.buf[:0] }

// tail returns the last stderrTail bytes written since reset.
func (g *guestOutput) tail() string {
	b := g.buf
	if len(b) > stderrTail {
		b = b[len(b)-stderrTail:]
	}
	return strings.TrimSpace(strings.ToValidUTF8(string(b), ""))
}
