package host

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/host/state"
)

// This file is the one place where errors become gRPC statuses.

// toStatus maps any error to a gRPC status error: an *abi.Error keeps its
// code (abi codes are gRPC codes), a status error passes, a context error
// keeps its meaning, a missing record is NOT_FOUND and anything else is
// INTERNAL.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var ae *abi.Error
	if errors.As(err, &ae) {
		if !ae.Code.Valid() {
			return status.Error(codes.Internal, ae.Message)
		}
		return status.Error(codes.Code(ae.Code), ae.Message)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, state.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
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
			s.log.Info("csi call failed", "method", info.FullMethod, "code", code.String(), "err", status.Convert(err).Message(), "took", time.Since(start))
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
