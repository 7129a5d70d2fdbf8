package cmd

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/auth"
)

// databaseURL is --database-url or --database-url-file: the URL may carry
// a password, so it can come from a file (or PAYOUTS_DATABASE_URL) rather
// than the command line, where ps shows it.
type databaseURL struct {
	url, file string
	c         *cobra.Command
}

func (d *databaseURL) register(c *cobra.Command, what string) {
	d.c = c
	c.Flags().StringVar(&d.url, "database-url", "", "PostgreSQL URL of "+what+" (visible in ps: prefer --database-url-file or "+EnvName("database-url")+")")
	c.Flags().StringVar(&d.file, "database-url-file", "", "file holding the PostgreSQL URL of "+what)
}

func (d *databaseURL) value() (string, error) {
	v, err := secret("database-url", d.url, d.file)
	if err == nil && v == "" {
		err = fmt.Errorf("--database-url-file or --database-url (or %s) is required", EnvName("database-url"))
	}
	if err == nil {
		err = d.check(v)
	}
	if err != nil {
		return "", &ExitError{Code: 2, Err: err}
	}
	return v, nil
}

// check refuses a URL PostgreSQL's driver cannot parse, naming where it
// came from: it was refused only deep in the role's start, as "cannot
// parse", exit 1. The driver's message is shown without the URL it
// quotes, which may hold a password.
func (d *databaseURL) check(v string) error {
	_, err := pgx.ParseConfig(v)
	if err == nil {
		return nil
	}
	where := "--database-url"
	if d.c != nil {
		if as := givenAs(d.c, "database-url"); as != "" {
			where = as
		}
		if as := givenAs(d.c, "database-url-file"); as != "" {
			where = "the URL in " + as + " " + d.file
		}
	}
	why := err.Error()
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) {
		if _, after, ok := strings.Cut(why, "`: "); ok {
			why = after
		}
	}
	return fmt.Errorf("%s must be a PostgreSQL URL (postgres://USER@HOST:PORT/DBNAME?sslmode=...) or keyword/value string: %s", where, why)
}

// secret is the value of --NAME or the contents of --NAME-file (at most one
// of them), trimmed of surrounding white space; "" when neither is given.
func secret(name, value, file string) (string, error) {
	switch {
	case value != "" && file != "":
		// Either may come from its variable (PAYOUTS_TOKEN in a cron
		// job's environment): name both, or the operator looks for a flag
		// they never typed.
		return "", fmt.Errorf("--%s (%s) and --%s-file (%s) are mutually exclusive: give one of them", name, EnvName(name), name, EnvName(name+"-file"))
	case file == "":
		// A variable made from a file (a Kubernetes secret, $(cat f))
		// often ends in a newline: kept, it made every request's
		// Authorization header invalid, refused by the HTTP client before
		// anything was sent.
		return strings.TrimSpace(value), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--%s-file: %w", name, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", errors.New("--" + name + "-file " + file + " is empty")
	}
	return v, nil
}

// bearerSecret is secret for a bearer token: also refused when what is left
// after trimming is not one token (two lines, a space, a control
// character), which no HTTP client can send as an Authorization header:
// accepted, every request failed before it was sent, as if the server
// were down (and a proxy recorded each payout it forwarded ambiguous).
func bearerSecret(name, value, file string) (string, error) {
	v, err := secret(name, value, file)
	if err != nil || v == "" {
		return v, err
	}
	if err := auth.CheckToken(v); err != nil {
		from := "--" + name + " (or " + EnvName(name) + ")"
		if file != "" {
			from = "--" + name + "-file " + file
		}
		return "", fmt.Errorf("%s: %w", from, err)
	}
	return v, nil
}
