// Command certworker obtains and renews TLS certificates over ACME for the domains a
// multi-tenant proxy keeps in PostgreSQL. docs/reference.md lists its commands and flags.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/alecthomas/kong"
)

// Exit statuses (docs/reference.md, "Exit status").
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

// usageError is bad usage or configuration: exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// failedError is a command that ran and failed (exit 1), with a message for the
// operator.
type failedError struct{ msg string }

func (e *failedError) Error() string { return e.msg }

// cli is the command line. Every flag can also be set by CERTWORKER_ + its name in
// upper case with - as _; --database-url also reads DATABASE_URL.
type cli struct {
	Migrate     migrateCmd     `cmd:"" help:"Apply the embedded database migrations (idempotent; safe to run from several instances at once)."`
	Run         runCmd         `cmd:"" help:"Run the worker, its HTTP-01 responder and its admin endpoints until SIGTERM or SIGINT."`
	Status      statusCmd      `cmd:"" help:"Show counts by ssl_status and every domain that is retrying or failed; with DOMAIN, that domain's whole state."`
	Retry       retryCmd       `cmd:"" help:"Put a failed or backing-off domain back in the queue now (pending, attempts 0, error cleared)."`
	Healthcheck healthcheckCmd `cmd:"" help:"Exit 0 when /readyz of the local instance (--admin-listen) answers 200, else 1; for images with no shell."`
	Rekey       rekeyCmd       `cmd:"" help:"Re-seal every stored private key with the first --key-encryption-key; refuses, changing nothing, if a stored key opens with none of them."`
	Version     versionCmd     `cmd:"" help:"Print the version, commit and Go version."`

	VersionFlag kong.VersionFlag `name:"version" help:"Print the version, commit and Go version, and exit."`
}

// flagGroups are the headings of `COMMAND --help`, in the order an operator sets
// certworker up: where the database is, which CA, a second one, how much to ask of
// them, what to check before ordering, the keys, where to listen, and the logs and
// timings. A flag names its group with a group:"KEY" tag; `run --help` lists the
// groups in the order of runCmd's fields, which follows this list.
var flagGroups = []kong.Group{
	{Key: "database", Title: "Database:", Description: "The proxy's PostgreSQL database, and how certworker connects to it and hears from it."},
	{Key: "ca", Title: "The CA:", Description: "The ACME CA certworker orders from, its account, and the certificates' keys."},
	{Key: "fallback", Title: "A second CA:", Description: "Asked for a domain the first CA cannot issue (docs/cas.md, \"A second CA\"); none without --acme-fallback-directory."},
	{Key: "limits", Title: "Limits:", Description: "The CA's rate limits as the fleet's ledger counts them, and this instance's pace and retries."},
	{Key: "preflight", Title: "Preflight and DNS:", Description: "What certworker checks of a name, and asks of DNS, before it orders."},
	{Key: "keys", Title: "Keys:", Description: "The key encryption keys that seal private keys at rest (docs/security.md)."},
	{Key: "listeners", Title: "Listeners:", Description: "The HTTP-01 responder and the admin endpoints (/healthz, /readyz, /metrics)."},
	{Key: "logs", Title: "Logs and timing:", Description: "The logs, and the intervals, deadlines and timeouts."},
	{Key: "selection", Title: "What to show:", Description: "Which domains status counts and lists, and how much of a domain's history it shows."},
}

// dbFlags is the connection flag every database command takes.
type dbFlags struct {
	DatabaseURL string `name:"database-url" env:"CERTWORKER_DATABASE_URL,DATABASE_URL" placeholder:"URL" group:"database" help:"PostgreSQL connection string (also CERTWORKER_DATABASE_URL, then DATABASE_URL)."`
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process: it parses args, runs the command and returns the
// exit status.
func run(args []string, stdout, stderr io.Writer) int {
	var c cli
	exitCode := -1
	parser, err := newParser(&c, stdout, stderr, func(code int) { exitCode = code })
	if err != nil {
		fmt.Fprintf(stderr, "certworker: %v\n", err)
		return exitFailed
	}
	kctx, err := parse(parser, args)
	if exitCode >= 0 {
		// --help, --version (0), or kong's own exit.
		return exitCode
	}
	if err != nil {
		fmt.Fprintf(stderr, "certworker: %v\n", err)
		return exitUsage
	}
	if err := kctx.Run(); err != nil {
		fmt.Fprintf(stderr, "certworker: %s\n", shown(oneLine(err.Error())))
		var ue *usageError
		if errors.As(err, &ue) {
			return exitUsage
		}
		return exitFailed
	}
	return exitOK
}

// parse reads args and the environment into the parser's cli, an empty variable
// counting as unset (unsetEmptyEnv).
func parse(parser *kong.Kong, args []string) (*kong.Context, error) {
	unsetEmptyEnv(emptyMeansOff(parser.Model))
	return parser.Parse(args)
}

// newParser is the command line's parser for c, writing to stdout and stderr, calling
// exit where kong would end the process (--help, --version).
func newParser(c *cli, stdout, stderr io.Writer, exit func(int)) (*kong.Kong, error) {
	return kong.New(c,
		kong.Name("certworker"),
		kong.Description("Obtains and renews TLS certificates over ACME for a multi-tenant proxy's domains, woken by PostgreSQL LISTEN/NOTIFY.\n\nEvery flag can also be set by the environment variable CERTWORKER_ + the flag name in upper case with - as _ (--poll-interval is CERTWORKER_POLL_INTERVAL). A flag beats its variable; an empty variable counts as unset.\n\ndocs/reference.md lists every command, flag, variable, endpoint, log field and metric; docs/running.md says how to run certworker."),
		kong.UsageOnError(),
		kong.Writers(stdout, stderr),
		kong.Exit(exit),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.ValueFormatter(helpWithDefault),
		kong.ExplicitGroups(flagGroups),
		kong.Vars{"version": versionLine(), "le": letsEncrypt},
		kong.Bind(&globals{stdout: stdout, stderr: stderr}),
	)
}

// helpWithDefault is kong's help text of a flag, with its default added where the
// flag's own column does not show it: kong shows a default in place of the
// placeholder only when the flag has none, so --http01-listen=ADDR would hide :80.
// Every default is then on --help, as docs/reference.md lists them.
func helpWithDefault(v *kong.Value) string {
	if !v.HasDefault || v.Tag.PlaceHolder == "" {
		return kong.DefaultHelpValueFormatter(v)
	}
	with := *v
	help, dot := strings.CutSuffix(v.Help, ".")
	with.Help = fmt.Sprintf("%s (default: %s)", help, v.Default)
	if dot {
		with.Help += "."
	}
	return kong.DefaultHelpValueFormatter(&with)
}

// globals are what every command gets besides its flags.
type globals struct {
	stdout, stderr io.Writer
}

// unsetEmptyEnv makes an empty CERTWORKER_* or DATABASE_URL variable count as unset
// (docs/reference.md, "Flags and variables"): kong would otherwise take the empty value over the default. The
// variables in keep are left alone: those of the flags whose empty value is one of
// their settings ("empty turns it off").
func unsetEmptyEnv(keep map[string]bool) {
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		if value == "" && !keep[name] && (strings.HasPrefix(name, "CERTWORKER_") || name == "DATABASE_URL") {
			os.Unsetenv(name)
		}
	}
}

// emptyMeansOff lists the variables of the flags tagged empty:"off", whose empty
// value turns something off (--http01-listen, --admin-listen): for them the flag's
// own rule beats "an empty variable counts as unset", so that an empty variable does
// what an empty flag does rather than bring the default back.
func emptyMeansOff(app *kong.Application) map[string]bool {
	keep := map[string]bool{}
	_ = kong.Visit(app, func(n kong.Visitable, next kong.Next) error {
		if f, ok := n.(*kong.Flag); ok && f.Tag.Get("empty") == "off" {
			for _, env := range f.Tag.Envs {
				keep[env] = true
			}
		}
		return next(nil)
	})
	return keep
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
