package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
)

// output is the -o/--output flag of every command that prints records:
// a table for people, JSON for programs.
type output struct {
	format string
	json   bool // --json, kept where DESIGN names it
}

// register adds -o/--output (and --json when jsonAlias) to c and checks
// the value before c runs.
func (o *output) register(c *cobra.Command, jsonAlias bool) {
	c.Flags().StringVarP(&o.format, "output", "o", "table", "output format: table or json")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))
	if jsonAlias {
		c.Flags().BoolVar(&o.json, "json", false, "same as --output json")
	}
	c.PreRunE = func(c *cobra.Command, _ []string) error { return o.check(c) }
}

// check refuses an unknown format, and --json and --output given together
// that disagree (--json --output table, --json=false --output json, or the
// same in PAYOUTS_JSON and PAYOUTS_OUTPUT): which one was meant cannot be
// told. The command line beats the environment before this (applyEnv:
// --output on the line keeps PAYOUTS_JSON out, --json PAYOUTS_OUTPUT).
func (o *output) check(c *cobra.Command) error {
	if o.format != "table" && o.format != "json" {
		return &ExitError{Code: 2, Err: fmt.Errorf("--output must be table or json, got %q", o.format)}
	}
	jsonAs, outputAs := givenAs(c, "json"), givenAs(c, "output")
	if jsonAs != "" && outputAs != "" && o.json != (o.format == "json") {
		return &ExitError{Code: 2, Err: fmt.Errorf("%s=%t and %s=%s contradict each other: give one of them", jsonAs, o.json, outputAs, o.format)}
	}
	if o.json {
		o.format = "json"
	}
	return nil
}

// isJSON reports whether records are printed as JSON.
func (o *output) isJSON() bool { return o.format == "json" }

// print writes v as indented JSON, or t as a table.
func (o *output) print(w io.Writer, v any, t *table) error {
	if o.isJSON() {
		return writeJSON(w, v)
	}
	return t.write(w)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table is rows of cells under an optional header, aligned in columns.
type table struct {
	rows [][]string
}

func newTable(header ...string) *table {
	t := &table{}
	if len(header) > 0 {
		t.rows = append(t.rows, header)
	}
	return t
}

// row adds a row. A cell is text the services stored (a reason, a
// rail's reference): control and format characters, line breaks and tabs
// among them, are shown escaped (\n, \x1b, \u202e), so that no cell can
// break the table or rewrite the terminal that shows it.
func (t *table) row(cells ...string) *table {
	out := make([]string, len(cells))
	for i, c := range cells {
		out[i] = cellText(c)
	}
	t.rows = append(t.rows, out)
	return t
}

// cellText is c with every control or format character escaped as Go
// quotes it.
func cellText(c string) string {
	if !strings.ContainsFunc(c, unprintable) {
		return c
	}
	var b strings.Builder
	for _, r := range c {
		if unprintable(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func unprintable(r rune) bool {
	return r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
}

func (t *table) write(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// dash shows an empty value as "-".
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// timeText formats an optional time in UTC ("-" when absent).
func timeText(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
