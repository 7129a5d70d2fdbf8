package payment

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

func sampleStepResults(n int) []pc.StepResult {
	at := time.Date(2026, 12, 3, 14, 0, 0, 123456789, time.UTC)
	res := make([]pc.StepResult, n)
	for i := range res {
		id := fmt.Sprintf("po-%03d", i)
		if i%10 == 9 {
			res[i] = pc.StepResult{PayoutID: id, Err: problem.New(problem.InvalidTransition, "payout %q is SUBMITTING", id)}
			continue
		}
		res[i] = pc.StepResult{PayoutID: id, Payout: pc.Payout{
			ID: id, AccountID: "acct-1", Amount: int64(100 + i), Currency: "EUR", BeneficiaryRef: "ben-" + id,
			State: pc.Claimed, ClientRef: "ref-" + id, ClaimedBy: "exec-1", Token: 42,
			CreatedAt: at, ClaimedAt: &at,
		}}
	}
	return res
}

// The answer's JSON is byte for byte what pc.StepResult renders.
func TestStepsAnswerSameJSON(t *testing.T) {
	res := sampleStepResults(30)
	got, err := json.Marshal(stepsAnswer(res))
	if err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(pc.StepsResponse{Items: res})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("answer JSON differs:\n got %s\nwant %s", got, want)
	}
	var back pc.StepsResponse
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Items) != len(res) || back.Items[9].Err == nil || back.Items[0].Payout.ID != "po-000" {
		t.Fatalf("decoded answer: %+v", back.Items[:10])
	}
}

func BenchmarkStepsAnswer(b *testing.B) {
	res := sampleStepResults(50)
	b.Run("per-item MarshalJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(pc.StepsResponse{Items: res}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoded once", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(stepsAnswer(res)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
