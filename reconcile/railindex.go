package reconcile

import (
	"context"
	"sort"
	"strings"

	"github.com/payouts/payouts/internal/auth"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
)

// ---- the rail's payments, by client reference ----

// railIndex answers "which rail payments carry this payout's client
// reference". With the settlement report it is a stream of the report's
// pages in client-reference order, merged with the payouts (a payout's
// D-10 reference sorts as its id does); without it, it asks the rail per
// reference.
type railIndex struct {
	rail   *railclient.Client
	stream *stream[railclient.Payment] // nil: ask per reference
	rep    *Report
	// unmatched holds the payments the merge passed without a payout
	// carrying their reference: suspects of payments made around the
	// system, read again before they are reported.
	unmatched map[string][]railclient.Payment
	// elsewhere holds the references of payouts whose reference is not
	// their D-10 one: their payments are not where the merge looks, so
	// they were looked up on their own and are not suspects.
	elsewhere map[string]bool
}

// notReportNote is the pass's note when the rail credential may not read
// the settlement report (the rail says so, or refuses it).
const notReportNote = "rail payments were looked up per payout and payments carrying no known client reference were not checked: the rail's settlement report is an operator's, and the rail credential is not (give --rail-report-token-file: an operator-role token of the rail)"

func (r *Reconciler) openRail(ctx context.Context, rep *Report) (*railIndex, error) {
	ri := &railIndex{rail: r.c.Rail, rep: rep}
	if r.opts.RailPerPayout {
		rep.note("rail payments were looked up per payout (--rail-per-payout); payments carrying no known client reference were not checked")
		return ri, nil
	}
	if r.c.RailReport == r.c.Rail {
		// The rail credential reads the report only if it may (a rail
		// without authentication: lookups need the reconciler role, the
		// report an operator's): a lookup-only one is not sent for it, or
		// each pass is a 403 at the rail, which alerts
		// (PayoutsCredentialRefused). A rail that cannot say (an error) is
		// asked for the report.
		if id, err := r.c.Rail.WhoAmI(ctx); err == nil && !id.Allows(auth.Operator) {
			rep.note(notReportNote)
			r.log.Info("rail credential is not an operator's: checking rail payments per payout only", "check", CheckRailWithoutSubmission, "rail_credential_role", string(id.Role))
			return ri, nil
		}
	}
	// The first page is read here: a refusal means per-payout lookups.
	first, err := r.c.RailReport.SettlementReportPage(ctx, "", r.opts.BulkPageSize)
	switch {
	case isForbidden(err) && r.c.RailReport != r.c.Rail:
		// A report credential given for the purpose and refused is a
		// refused token: fatal, not a note a clean pass would hide.
		return nil, cannotRun("the rail refused --rail-report-token-file its settlement report (it must be an operator-role token of the rail)", err)
	case isForbidden(err):
		rep.note(notReportNote)
		r.log.Warn("rail settlement report forbidden; checking rail payments per payout only", "check", CheckRailWithoutSubmission)
		return ri, nil
	case err != nil:
		return nil, cannotRun("read the rail's settlement report", err)
	}
	ri.unmatched = map[string][]railclient.Payment{}
	ri.elsewhere = map[string]bool{}
	ri.stream = openStream(ctx, "the rail's settlement report", func(p railclient.Payment) string { return p.ClientRef },
		func(ctx context.Context, cursor string) ([]railclient.Payment, string, error) {
			if cursor == "" {
				return first.Items, first.Next, nil
			}
			page, err := r.c.RailReport.SettlementReportPage(ctx, cursor, r.opts.BulkPageSize)
			return page.Items, page.Next, err
		})
	return ri, nil
}

// take returns the report's payments for p; known is false when the rail
// must be asked about p on its own (no report, or a reference that is not
// p's D-10 one). Only the merge loop calls it.
func (ri *railIndex) take(p pc.Payout) (pays []railclient.Payment, known bool, err error) {
	if ri.stream == nil {
		return nil, false, nil
	}
	ref := pc.ClientRef(p.ID)
	if p.ClientRef != ref {
		ri.elsewhere[p.ClientRef] = true
		return nil, false, nil
	}
	pays, err = ri.stream.takeUpTo(ref, ri.passed)
	ri.rep.Scanned.RailPayments += len(pays)
	return pays, true, err
}

// passed records a payment no payout of the stream claimed.
func (ri *railIndex) passed(p railclient.Payment) {
	ri.rep.Scanned.RailPayments++
	ri.unmatched[p.ClientRef] = append(ri.unmatched[p.ClientRef], p)
}

// drain reads the rest of the report: payments after the last payout.
func (ri *railIndex) drain() error {
	if ri.stream == nil {
		return nil
	}
	for {
		p, ok, err := ri.stream.head()
		if err != nil || !ok {
			return err
		}
		ri.passed(p)
		ri.stream.next()
	}
}

// fresh asks the rail now, whatever the report held.
func (ri *railIndex) fresh(ctx context.Context, clientRef string) ([]railclient.Payment, error) {
	l, err := ri.rail.Find(ctx, clientRef)
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// reportOrphans reports the rail payments whose reference belongs to no
// payout. A reference the merge matched to none is read again: its payout
// may have been created after the payout stream went past it (then the
// next pass checks it).
func (r *Reconciler) reportOrphans(ctx context.Context, rep *Report, ri *railIndex) error {
	refs := make([]string, 0, len(ri.unmatched))
	for ref := range ri.unmatched {
		if !ri.elsewhere[ref] {
			refs = append(refs, ref)
		}
	}
	sort.Strings(refs)
	for _, ref := range refs {
		if id, ok := strings.CutPrefix(ref, pc.ClientRefPrefix); ok {
			p, err := r.c.Payment.Payout(ctx, id)
			switch {
			case err == nil && p.ClientRef == ref:
				continue
			case err != nil && !isNotFound(err):
				return cannotRun("read payout "+id, err)
			}
		}
		pays := ri.unmatched[ref]
		rep.add(CheckRailWithoutSubmission, map[string]any{"client_ref": ref, "rail_refs": railRefs(pays), "payments": len(pays)},
			"the rail holds %d payment(s) with client reference %s, which belongs to no payout: money was sent around the system", len(pays), ref)
	}
	return nil
}
