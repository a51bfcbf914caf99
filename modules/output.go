package modules

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Bounds of what a guest's output costs the daemon. Every line a guest
// writes to stdout or stderr or passes to the log import counts against its
// call and against its module; a line over either bound is dropped and
// counted (metrics log_dropped_lines_total and log_dropped_bytes_total), and
// a call that dropped anything says so in one line of its own.
const (
	maxLine        = 4 << 10  // a longer line is cut here and the rest of it dropped
	callLogLines   = 100      // lines one call may log
	callLogBytes   = 32 << 10 // bytes one call may log
	moduleLogRate  = 100      // lines per second a module may log, over all its instances,
	moduleLogBurst = 500      // after a burst of this many
	stderrTail     = 4 << 10  // stderr kept per call, attached to trap errors
)

// logBudget is what the running call may still log; the instance resets it
// at the start of each call.
type logBudget struct {
	lines, bytes               int // logged by this call
	droppedLines, droppedBytes int // dropped by this call
}

// logBucket rate-limits the lines of one module version: a token bucket of
// moduleLogBurst lines refilled at moduleLogRate per second.
type logBucket struct {
	mu     sync.Mutex
	tokens float64
	last   time.Time
}

func (b *logBucket) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last.IsZero() {
		b.tokens = moduleLogBurst
	} else {
		b.tokens = min(moduleLogBurst, b.tokens+now.Sub(b.last).Seconds()*moduleLogRate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// logLine logs one line of the running call's guest output, within the
// call's and the module's bounds; stream is "stdout" or "stderr", or "" for
// the log import, and cut counts bytes of the line already dropped for being
// over maxLine.
func (inst *instance) logLine(level slog.Level, stream string, line []byte, cut int) {
	lb := &inst.logs
	lb.droppedBytes += cut
	if lb.lines >= callLogLines || lb.bytes+len(line) > callLogBytes || !inst.m.logs.allow(time.Now()) {
		// Once over a bound the call logs nothing more: the rest of its
		// lines cost a count each, not a clock read and a lock.
		lb.lines = callLogLines
		lb.droppedLines++
		lb.droppedBytes += len(line)
		return
	}
	lb.lines++
	lb.bytes += len(line)
	attrs := make([]any, 0, 6)
	if stream != "" {
		attrs = append(attrs, "stream", stream)
	}
	if cut > 0 {
		attrs = append(attrs, "cut_bytes", cut)
	}
	inst.m.log.Log(context.Background(), level, strings.ToValidUTF8(string(line), "\uFFFD"), append(attrs, "op", inst.op)...)
}

// endLogs closes the call's output accounting: what it dropped goes to the
// metrics and, within the module's rate, to one log line.
func (inst *instance) endLogs() {
	lb := inst.logs
	inst.logs = logBudget{}
	if lb.droppedLines == 0 && lb.droppedBytes == 0 {
		return
	}
	if mt := inst.m.rt.metrics; mt != nil {
		mt.logDroppedLines.WithLabelValues(inst.m.name).Add(float64(lb.droppedLines))
		mt.logDroppedBytes.WithLabelValues(inst.m.name).Add(float64(lb.droppedBytes))
	}
	if inst.m.logs.allow(time.Now()) {
		inst.m.log.Warn("guest output over its bounds was dropped", "op", inst.op,
			"dropped_lines", lb.droppedLines, "dropped_bytes", lb.droppedBytes,
			"call_lines", callLogLines, "call_bytes", callLogBytes, "module_lines_per_second", moduleLogRate)
	}
}

// guestOutput is one instance's stdout or stderr: it logs whole lines with
// the module's name and the running operation and, for stderr, keeps the last
// stderrTail bytes written during the current call. Only the goroutine
// running the instance's call writes to it.
type guestOutput struct {
	inst     *instance
	stream   string
	level    slog.Level
	keepTail bool
	line     []byte // the current line, at most maxLine bytes
	cut      int    // bytes of the current line dropped past maxLine
	buf      []byte // recent output, trimmed to stderrTail when read
}

func newGuestOutput(inst *instance, stream string, level slog.Level, keepTail bool) *guestOutput {
	return &guestOutput{inst: inst, stream: stream, level: level, keepTail: keepTail}
}

func (g *guestOutput) Write(p []byte) (int, error) {
	// One fd_write may pass millions of iovecs, each written here in
	// turn, and the host's time on them is not counted anywhere else: a
	// guest whose time is spent is stopped at the next one.
	if exit := g.inst.clock.check(); exit != nil {
		panic(exit)
	}
	if g.keepTail {
		if len(p) >= stderrTail {
			g.buf = append(g.buf[:0], p[len(p)-stderrTail:]...)
		} else {
			g.buf = append(g.buf, p...)
			if len(g.buf) > 2*stderrTail {
				g.buf = append(g.buf[:0], g.buf[len(g.buf)-stderrTail:]...)
			}
		}
	}
	rest := p
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		part := rest
		if i >= 0 {
			part = rest[:i]
		}
		room := maxLine - len(g.line)
		if len(part) > room {
			g.cut += len(part) - room
			part = part[:room]
		}
		g.line = append(g.line, part...)
		if i < 0 {
			break
		}
		g.emit()
		rest = rest[i+1:]
	}
	return len(p), nil
}

// flush logs a pending partial line.
func (g *guestOutput) flush() {
	if len(g.line) > 0 || g.cut > 0 {
		g.emit()
	}
}

func (g *guestOutput) emit() {
	g.inst.logLine(g.level, g.stream, g.line, g.cut)
	g.line, g.cut = g.line[:0], 0
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
