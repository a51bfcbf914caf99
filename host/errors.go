package host

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
)

// This file is the one place where errors become gRPC statuses.

// maxStatusMessage bounds the message of every status the CO receives. A
// module's answer (its own error text, or a trap with its stderr) can be of
// any size, and gRPC clients refuse a response over 4 MiB by default, so an
// unbounded message could make the CO see a transport error instead of the
// code, or fill its logs; what is cut is still in the daemon's log.
const maxStatusMessage = 4 << 10

// toStatus maps any error to a gRPC status error: an *abi.Error keeps its
// code (abi codes are gRPC codes), a status error passes, a context error
// keeps its meaning, a missing record is NOT_FOUND and anything else is
// INTERNAL. The message is valid UTF-8 of at most maxStatusMessage bytes
// (plus a note of how much was cut).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	c, msg := codes.Internal, ""
	var ae *abi.Error
	if st, ok := status.FromError(err); ok {
		if len(st.Message()) <= maxStatusMessage && utf8.ValidString(st.Message()) {
			return err
		}
		c, msg = st.Code(), st.Message()
	} else if errors.As(err, &ae) {
		msg = ae.Message
		if ae.Code.Valid() {
			c = codes.Code(ae.Code)
		}
	} else {
		msg = err.Error()
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			c = codes.DeadlineExceeded
		case errors.Is(err, context.Canceled):
			c = codes.Canceled
		case errors.Is(err, state.ErrNotFound):
			c = codes.NotFound
		}
	}
	return status.Error(c, truncate(strings.ToValidUTF8(msg, "\uFFFD"), maxStatusMessage))
}

// truncate cuts s to at most n bytes, at a rune boundary, and says how many
// bytes it left out.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d more bytes)", s[:cut], len(s)-cut)
}

// errf builds a status error; handlers use it for the spec's named codes.
func errf(c codes.Code, format string, args ...any) error {
	return status.Error(c, fmt.Sprintf(format, args...))
}

// unaryInterceptor logs every call, counts it, recovers from a panic in a
// handler (the daemon keeps serving; the call fails INTERNAL) and maps the
// error to a status.
func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("handler panic", "method", info.FullMethod, "panic", r)
			resp, err = nil, status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
		}
		code := status.Code(err)
		s.metrics.observe(info.FullMethod, code, time.Since(start))
		if err != nil {
			s.log.Warn("csi call failed", "method", info.FullMethod, "code", code.String(), "err", status.Convert(err).Message(), "took", time.Since(start))
		} else {
			s.log.Debug("csi call", "method", info.FullMethod, "took", time.Since(start))
		}
	}()
	resp, err = handler(ctx, req)
	return resp, toStatus(err)
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("stream handler panic", "method", info.FullMethod, "panic", r)
			err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
		}
		s.metrics.observe(info.FullMethod, status.Code(err), time.Since(start))
	}()
	return toStatus(handler(srv, ss))
}
