package acme

import (
	"fmt"
	"strings"
	"sync"

	legolog "github.com/go-acme/lego/v4/log"
	"go.uber.org/zap"
)

// lego logs through a package-level standard logger that writes plain text to stderr,
// which would break the worker's rule that stderr holds zap JSON lines only. New
// replaces it, once per process, with one that writes to zap's global logger (zap.L,
// named "lego", at debug level: lego narrates every step of every order), looked up
// at each line. zap.L discards until the program calls zap.ReplaceGlobals.
//
// Not an Issuer's own logger: lego's logger is one per process while Issuers are
// many in tests, and a test's logger must not receive lines after its test ended.
// lego's lines carry domain names and URLs, never keys.
var legoLogOnce sync.Once

func routeLegoLog() {
	legoLogOnce.Do(func() { legolog.Logger = zapStdLogger{} })
}

// zapStdLogger is lego's StdLogger on top of zap.L(). Its Fatal methods log at error
// level and do not exit: a library must not end the worker.
type zapStdLogger struct{}

func (zapStdLogger) log() *zap.Logger { return zap.L().Named("lego") }

func (l zapStdLogger) Print(args ...any)   { l.log().Debug(trimNL(fmt.Sprint(args...))) }
func (l zapStdLogger) Println(args ...any) { l.log().Debug(trimNL(fmt.Sprintln(args...))) }
func (l zapStdLogger) Printf(format string, args ...any) {
	l.log().Debug(trimNL(fmt.Sprintf(format, args...)))
}
func (l zapStdLogger) Fatal(args ...any)   { l.log().Error(trimNL(fmt.Sprint(args...))) }
func (l zapStdLogger) Fatalln(args ...any) { l.log().Error(trimNL(fmt.Sprintln(args...))) }
func (l zapStdLogger) Fatalf(format string, args ...any) {
	l.log().Error(trimNL(fmt.Sprintf(format, args...)))
}

func trimNL(s string) string { return strings.TrimRight(s, "\n") }
