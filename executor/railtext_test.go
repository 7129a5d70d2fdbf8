package executor

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/wire"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
)

// TestRailTextThePaymentResourceRefusesDoesNotStallTheAccount: a rail is
// outside the system, and the references and decline codes it answers with
// are its own text: here over 200 bytes, with a line break and a format
// character. The proxy records them as they came; the executor reports
// them to the payment resource as one line it accepts, so the page is
// posted or failed as the rail answered instead of its outcome report
// being refused, round after round, with the money held.
func TestRailTextThePaymentResourceRefusesDoesNotStallTheAccount(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ugly := "RR\r\nX-Rail: \u202e" + strings.Repeat("r", 300)
	uglyJSON := strconv.Quote(ugly) // a valid JSON string: \r, \n and \u202e escapes
	field := regexp.MustCompile(`"(rail_ref|error_code)":"[^"]+"`)

	target, err := url.Parse(s.st.Ready.ProxyURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(res *http.Response) error {
		body, err := io.ReadAll(res.Body)
		if err != nil {
			return err
		}
		body = field.ReplaceAllFunc(body, func(m []byte) []byte {
			name := m[:bytes.IndexByte(m[1:], '"')+2]
			return append(append(name, ':'), uglyJSON...)
		})
		res.Body = io.NopCloser(bytes.NewReader(body))
		res.ContentLength = int64(len(body))
		res.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	front := httptest.NewServer(rp)
	t.Cleanup(front.Close)

	ctx := context.Background()
	const account = "rt-a"
	ids := s.fundedPage(t, account, 3)
	declined := account + "-declined"
	if _, err := s.pay.CreatePayout(ctx, pc.CreatePayoutRequest{ID: declined, AccountID: account, Amount: 100, Currency: "EUR",
		BeneficiaryRef: railclient.DefaultDeclinePrefix + "closed"}); err != nil {
		t.Fatal(err)
	}
	cfg := s.config(t, "rt-exec", io.Discard)
	cfg.ProxyURL = front.URL
	runUntil(t, cfg, "the page to be posted and the declined payout failed", func() bool {
		return s.allIn(t, ids, pc.Posted)() && s.state(t, declined) == pc.Failed
	})

	want := wire.OneLine(ugly, wire.MaxRefLen)
	for _, id := range append(ids, declined) {
		p, err := s.pay.Payout(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		got := p.RailRef
		if id == declined {
			got = p.ErrorCode
		}
		if got != want {
			t.Errorf("%s (%s): recorded %q; want the rail's text as one line, %q", id, p.State, got, want)
		}
	}
}
