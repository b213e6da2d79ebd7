package grpcserver

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"google.golang.org/grpc/grpclog"
)

// RouteGRPCLog sends what grpc-go and the REST gateway log through grpclog to log, with
// component=grpc: without it they write their own lines to stderr (`2026/12/04 19:20:30 ERROR:
// Failed to decode request: …` for a REST body the caller was already told about, `Failed to
// flush response to client: … broken pipe` for a client that went away), which no
// RINGFENCE_LOG_FORMAT=json reader can parse and which call a caller's mistake an error.
// Their errors concern one request whose caller got its answer: info, like the access line
// of a refused RPC; their info and warnings (connection chatter) are debug. Call it once,
// before any gRPC server or client exists (grpclog.SetLoggerV2 is not safe later).
func RouteGRPCLog(log *slog.Logger) {
	grpclog.SetLoggerV2(grpcLogger{log: log.With("component", "grpc")})
}

type grpcLogger struct{ log *slog.Logger }

func (g grpcLogger) at(level slog.Level, msg string) { g.log.Log(context.Background(), level, msg) }

func (g grpcLogger) Info(args ...any)   { g.at(slog.LevelDebug, fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any) { g.at(slog.LevelDebug, sprintln(args...)) }
func (g grpcLogger) Infof(format string, args ...any) {
	g.at(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Warning(args ...any)   { g.at(slog.LevelDebug, fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any) { g.at(slog.LevelDebug, sprintln(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) {
	g.at(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Error(args ...any)   { g.at(slog.LevelInfo, fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any) { g.at(slog.LevelInfo, sprintln(args...)) }
func (g grpcLogger) Errorf(format string, args ...any) {
	g.at(slog.LevelInfo, fmt.Sprintf(format, args...))
}

func (g grpcLogger) Fatal(args ...any) { g.at(slog.LevelError, fmt.Sprint(args...)); os.Exit(1) }
func (g grpcLogger) Fatalln(args ...any) {
	g.at(slog.LevelError, sprintln(args...))
	os.Exit(1)
}
func (g grpcLogger) Fatalf(format string, args ...any) {
	g.at(slog.LevelError, fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V reports whether verbose logging at level l is on: grpc-go's verbose levels are all below
// debug, so only level 0, and only when debug lines are written.
func (g grpcLogger) V(l int) bool {
	return l <= 0 && g.log.Enabled(context.Background(), slog.LevelDebug)
}

// sprintln is fmt.Sprintln without its trailing newline: slog ends the line itself.
func sprintln(args ...any) string {
	s := fmt.Sprintln(args...)
	return s[:len(s)-1]
}
