package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/metricsource"
)

// referencePage is the reference the tests below hold against the binary, as failure
// messages name it (from the repository's top) and as the test reads it.
const (
	referencePage = "docs/reference.md"
	referenceFile = "../../" + referencePage
)

// The tables of docs/reference.md the binary is checked against, each under its own
// heading. A row's first cell is its key.
const (
	commandsTable = "### Commands"
	flagsTable    = "### Flags and variables"
	metricsTable  = "### Metrics"
)

// everyCommand is what the flags table's commands cell says of a flag of the root
// command, which every command takes (--version).
const everyCommand = "every command"

// reference is docs/reference.md's tables, read once: heading → rows → cells.
var reference = sync.OnceValues(func() (map[string][][]string, error) {
	b, err := os.ReadFile(referenceFile)
	if err != nil {
		return nil, err
	}
	tables := map[string][][]string{}
	heading, header := "", false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "#"):
			heading, header = strings.TrimSpace(line), true
		case !strings.HasPrefix(line, "|"):
			if len(tables[heading]) > 0 {
				heading = "" // only a heading's first table counts
			}
		case header:
			header = false // the header row; the separator row follows
		case strings.HasPrefix(line, "|---") || strings.HasPrefix(line, "| ---"):
		case heading != "":
			tables[heading] = append(tables[heading], tableCells(line))
		}
	}
	return tables, nil
})

// tableCells splits a Markdown table row into its cells, trimmed; "\|" inside a cell
// is a |.
func tableCells(line string) []string {
	line = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(line), "|"), "|")
	var cells []string
	var cell strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cell.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cell.String()))
			cell.Reset()
		default:
			cell.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(cell.String()))
}

// codeSpans is the `code` spans of a cell, in order.
func codeSpans(cell string) []string {
	var out []string
	for {
		_, rest, ok := strings.Cut(cell, "`")
		if !ok {
			return out
		}
		span, after, ok := strings.Cut(rest, "`")
		if !ok {
			return out
		}
		out = append(out, span)
		cell = after
	}
}

// referenceTable is one of the reference's tables, failing the test when it is
// missing or a row has fewer than cols cells.
func referenceTable(t *testing.T, heading string, cols int) [][]string {
	t.Helper()
	tables, err := reference()
	require.NoError(t, err)
	rows := tables[heading]
	require.NotEmpty(t, rows, "%s has no table under %q", referencePage, heading)
	for _, r := range rows {
		require.GreaterOrEqual(t, len(r), cols, "%s, %q: row %q has fewer than %d cells", referencePage, heading, r, cols)
	}
	return rows
}

// cliFlag is a flag of the binary's command line as the reference lists it.
type cliFlag struct {
	commands []string // sorted; everyCommand for the root's
	envs     []string
	def      string // "" when it has none
	help     string
}

// binaryFlags is every flag of the CLI's kong model but kong's own --help and the
// hidden ones (tests' knobs, not an interface), by name.
func binaryFlags(t *testing.T) map[string]*cliFlag {
	t.Helper()
	var c cli
	parser, err := newParser(&c, io.Discard, io.Discard, func(int) {})
	require.NoError(t, err)
	out := map[string]*cliFlag{}
	add := func(command string, flags []*kong.Flag) {
		for _, f := range flags {
			if f.Name == "help" || f.Hidden {
				continue
			}
			def := ""
			if f.HasDefault {
				def = f.Default
			}
			cf, ok := out[f.Name]
			if !ok {
				cf = &cliFlag{envs: f.Tag.Envs, def: def, help: f.Help}
				out[f.Name] = cf
			}
			require.Equal(t, cf.def, def, "--%s has two defaults in the binary, one of them in %s", f.Name, command)
			require.Equal(t, cf.envs, f.Tag.Envs, "--%s has two sets of variables in the binary, one of them in %s", f.Name, command)
			cf.commands = append(cf.commands, command)
		}
	}
	add(everyCommand, parser.Model.Flags)
	for _, cmd := range parser.Model.Children {
		add(cmd.Name, cmd.Flags)
	}
	for _, f := range out {
		sort.Strings(f.commands)
	}
	return out
}

// referenceFlags is the reference's flags table by flag name: | flag | commands |
// variables | default | meaning |. A default is the cell's `code`; a cell without
// one says the flag has none.
func referenceFlags(t *testing.T) map[string]*cliFlag {
	t.Helper()
	out := map[string]*cliFlag{}
	for _, r := range referenceTable(t, flagsTable, 5) {
		names := codeSpans(r[0])
		require.Len(t, names, 1, "%s, %q: the first cell of %q is not one `--flag`", referencePage, flagsTable, r)
		name := strings.TrimPrefix(names[0], "--")
		require.NotContains(t, out, name, "%s, %q: --%s has two rows", referencePage, flagsTable, name)
		f := &cliFlag{envs: codeSpans(r[2]), help: r[4]}
		if r[1] == everyCommand {
			f.commands = []string{everyCommand}
		} else {
			for _, c := range strings.Split(r[1], ",") {
				f.commands = append(f.commands, strings.TrimSpace(c))
			}
		}
		sort.Strings(f.commands)
		if d := codeSpans(r[3]); len(d) > 0 {
			f.def = d[0]
		}
		out[name] = f
	}
	return out
}

// flagRow is the row of the flags table that f makes.
func flagRow(name string, f *cliFlag) string {
	envs := make([]string, len(f.envs))
	for i, e := range f.envs {
		envs[i] = "`" + e + "`"
	}
	def := "none"
	if f.def != "" {
		def = "`" + f.def + "`"
	}
	return fmt.Sprintf("| `--%s` | %s | %s | %s | %s |", name, strings.Join(f.commands, ", "), strings.Join(envs, ", "), def,
		strings.ReplaceAll(f.help, "|", `\|`))
}

// Every flag and variable of the command line is in docs/reference.md's flags table
// with the commands that take it, its variables and its default, and the table lists
// no flag the binary lacks. Guards against a page that drifts from --help, as the
// pages before it did: flags in no page, metrics in none, defaults that had changed.
func TestReference_ListsEveryFlagVariableAndDefaultOfTheBinary(t *testing.T) {
	t.Parallel()
	bin, ref := binaryFlags(t), referenceFlags(t)
	require.Greater(t, len(bin), 60, "flags read from the binary")
	for _, name := range sortedKeys(bin) {
		b, r := bin[name], ref[name]
		if r == nil {
			t.Errorf("%s, %q lacks --%s: add the row\n%s", referencePage, flagsTable, name, flagRow(name, b))
			continue
		}
		if !slices.Equal(b.commands, r.commands) || !slices.Equal(b.envs, r.envs) || b.def != r.def {
			t.Errorf("%s, %q: the row of --%s says commands %q, variables %q, default %q; the binary's are %q, %q, %q: change those cells, as in\n%s",
				referencePage, flagsTable, name, r.commands, r.envs, r.def, b.commands, b.envs, b.def, flagRow(name, b))
		}
	}
	for _, name := range sortedKeys(ref) {
		if bin[name] == nil {
			t.Errorf("%s, %q lists --%s, which the binary does not have: remove its row", referencePage, flagsTable, name)
		}
	}
}

// Every command of the binary has its row in docs/reference.md's commands table, and
// the table lists no other. Guards against a command added or renamed in the code
// alone.
func TestReference_ListsEveryCommandOfTheBinary(t *testing.T) {
	t.Parallel()
	var c cli
	parser, err := newParser(&c, io.Discard, io.Discard, func(int) {})
	require.NoError(t, err)
	bin := map[string]string{}
	for _, cmd := range parser.Model.Children {
		bin[cmd.Name] = cmd.Help
	}
	ref := map[string]bool{}
	for _, r := range referenceTable(t, commandsTable, 2) {
		spans := codeSpans(r[0])
		require.NotEmpty(t, spans, "%s, %q: the first cell of %q names no `command`", referencePage, commandsTable, r)
		ref[strings.Fields(spans[0])[0]] = true
	}
	for _, name := range sortedKeys(bin) {
		if !ref[name] {
			t.Errorf("%s, %q lacks %s: add the row\n| `%s` | %s |", referencePage, commandsTable, name, name, bin[name])
		}
	}
	for _, name := range sortedKeys(ref) {
		if _, ok := bin[name]; !ok {
			t.Errorf("%s, %q lists %s, which the binary does not have: remove its row", referencePage, commandsTable, name)
		}
	}
}

// Every metric certworker registers (read from its source, so that a Vec no label
// value has reached yet counts) is in docs/reference.md's metrics table with its
// labels and whether it is a histogram, and the table lists no other. The Go
// runtime's and the process's collectors (go_*, process_*) are client_golang's, not
// listed. Guards against the metrics the operator's page left out, among them the one
// a critical alert reads (certworker_listener_connected).
func TestReference_ListsEveryMetricTheBinaryExports(t *testing.T) {
	t.Parallel()
	bin, err := metricsource.Read("../..")
	require.NoError(t, err)
	require.Contains(t, bin, "certworker_listener_connected", "metrics read from the source")
	row := func(name string, d metricsource.Def) string {
		kind := "gauge"
		if strings.HasSuffix(name, "_total") {
			kind = "counter"
		}
		if d.Histogram {
			kind = "histogram"
		}
		labels := make([]string, 0, len(d.Labels))
		for _, l := range sortedKeys(d.Labels) {
			labels = append(labels, "`"+l+"`")
		}
		if len(labels) == 0 {
			labels = []string{"none"}
		}
		return fmt.Sprintf("| `%s` | %s | %s | (what it counts) |", name, kind, strings.Join(labels, ", "))
	}
	ref := map[string]metricsource.Def{}
	for _, r := range referenceTable(t, metricsTable, 4) {
		names := codeSpans(r[0])
		require.Len(t, names, 1, "%s, %q: the first cell of %q is not one `metric`", referencePage, metricsTable, r)
		d := metricsource.Def{Histogram: r[1] == "histogram", Labels: map[string]bool{}}
		for _, l := range codeSpans(r[2]) {
			d.Labels[l] = true
		}
		require.NotContains(t, ref, names[0], "%s, %q: %s has two rows", referencePage, metricsTable, names[0])
		ref[names[0]] = d
	}
	for _, name := range sortedKeys(bin) {
		r, ok := ref[name]
		switch {
		case !ok:
			t.Errorf("%s, %q lacks %s: add the row\n%s", referencePage, metricsTable, name, row(name, bin[name]))
		case r.Histogram != bin[name].Histogram || !maps.Equal(r.Labels, bin[name].Labels):
			t.Errorf("%s, %q: the row of %s has other labels, or is or is not a histogram, unlike the binary's: change those cells, as in\n%s", referencePage, metricsTable, name, row(name, bin[name]))
		}
	}
	for _, name := range sortedKeys(ref) {
		if _, ok := bin[name]; !ok {
			t.Errorf("%s, %q lists %s, which the binary does not export: remove its row", referencePage, metricsTable, name)
		}
	}
}

// Every default of every flag shows on --help: in the flag's column where it has no
// placeholder, else as "(default: X)" in its text (helpWithDefault). Guards against
// --http01-listen=ADDR and the --limit-* flags, whose defaults --help did not show.
func TestCLI_HelpShowsEveryDefault(t *testing.T) {
	t.Parallel()
	for name, f := range binaryFlags(t) {
		if f.def == "" {
			continue
		}
		for _, command := range f.commands {
			args := []string{command, "--help"}
			if command == everyCommand {
				args = []string{"--help"}
			}
			code, stdout, _ := invoke(t, args...)
			require.Equal(t, 0, code)
			// The flag's entry: from its name to its variables, which end every entry.
			text := strings.Join(strings.Fields(stdout), " ")
			start := strings.Index(text, "--"+name+"=")
			require.GreaterOrEqual(t, start, 0, "%s --help does not list --%s", command, name)
			entry, _, _ := strings.Cut(text[start:], "($")
			shown := strings.HasPrefix(entry, fmt.Sprintf("--%s=%q ", name, f.def)) ||
				strings.HasPrefix(entry, fmt.Sprintf("--%s=%s ", name, f.def)) ||
				strings.Contains(entry, "(default: "+f.def+")")
			require.True(t, shown, "%s --help does not show --%s's default %q: %s", command, name, f.def, entry)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
