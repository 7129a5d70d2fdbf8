package paymentclient

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
)

func sampleAnswer(t testing.TB, n int) ([]StepResult, []byte) {
	at := time.Date(2026, 12, 3, 14, 0, 0, 123456789, time.UTC)
	res := make([]StepResult, n)
	for i := range res {
		id := fmt.Sprintf("po-%03d", i)
		if i%10 == 9 {
			res[i] = StepResult{PayoutID: id, Err: problem.New(problem.InvalidTransition, "payout %q is SUBMITTING", id)}
			continue
		}
		res[i] = StepResult{PayoutID: id, Payout: Payout{
			ID: id, AccountID: "acct-1", Amount: int64(100 + i), Currency: "EUR", BeneficiaryRef: "ben-" + id,
			State: Claimed, ClientRef: "ref-" + id, ClaimedBy: "exec-1", Token: 42, CreatedAt: at, ClaimedAt: &at,
		}}
	}
	b, err := json.Marshal(StepsResponse{Items: res})
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

// The wire form StepsThen decodes gives the same results as StepResult's
// own UnmarshalJSON, payouts and problems alike.
func TestStepWireDecodesBothForms(t *testing.T) {
	_, body := sampleAnswer(t, 30)
	var viaResult StepsResponse
	if err := json.Unmarshal(body, &viaResult); err != nil {
		t.Fatal(err)
	}
	var wire struct {
		Items []stepWire `json:"items"`
	}
	if err := json.Unmarshal(body, &wire); err != nil {
		t.Fatal(err)
	}
	viaWire, err := stepResults(wire.Items)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(viaWire, viaResult.Items) {
		t.Fatalf("wire decode differs:\n got %+v\nwant %+v", viaWire, viaResult.Items)
	}
	if viaWire[9].Err == nil || !problem.Has(viaWire[9].Err, problem.InvalidTransition) || viaWire[9].PayoutID != "po-009" {
		t.Errorf("item 9: %+v, want its invalid_transition problem", viaWire[9])
	}
	if viaWire[0].Err != nil || viaWire[0].Payout.State != Claimed || viaWire[0].PayoutID != "po-000" || viaWire[0].Payout.ClaimedAt == nil {
		t.Errorf("item 0: %+v, want the claimed payout", viaWire[0])
	}
}

func BenchmarkStepsDecode(b *testing.B) {
	_, body := sampleAnswer(b, 50)
	b.Run("StepResult.UnmarshalJSON per item", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var out StepsResponse
			if err := json.Unmarshal(body, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("wire form", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var out struct {
				Items []stepWire `json:"items"`
			}
			if err := json.Unmarshal(body, &out); err != nil {
				b.Fatal(err)
			}
			if _, err := stepResults(out.Items); err != nil {
				b.Fatal(err)
			}
		}
	})
}
