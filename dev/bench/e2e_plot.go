package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// E2EPlotSVG draws one run as an SVG image: payouts created and completed
// per second (top panel) and the p50/p99 latency of the payouts completed
// in each second (bottom panel, milliseconds).
func E2EPlotSVG(w io.Writer, r E2EResult) error {
	const (
		width, height = 800, 520
		left, right   = 70, 20
		panelH        = 190
		top1, top2    = 50, 300
	)
	n := len(r.Timeline)
	if n == 0 {
		return fmt.Errorf("plot: the run has no timeline")
	}
	var maxRate, maxLat float64
	for _, s := range r.Timeline {
		maxRate = math.Max(maxRate, float64(max(s.Created, s.Done)))
		maxLat = math.Max(maxLat, s.P99Ms)
	}
	maxRate, maxLat = niceCeil(maxRate), niceCeil(maxLat)
	plotW := float64(width - left - right)
	x := func(i float64) float64 { return float64(left) + plotW*i/float64(n) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">payouts bench e2e: %d payouts, %d accounts, %d executor(s) x %d, %d replica(s), rail latency %d ms</text>`+"\n",
		left, r.Payouts, r.Accounts, r.Executors, r.Concurrency, r.Replicas, r.RailLatencyMs)
	fmt.Fprintf(&b, `<text x="%d" y="36">%.0f payouts/s, p50 %.1f ms, p99 %.1f ms, %d duplicates</text>`+"\n",
		left, r.PayoutsPerSec, r.P50Ms, r.P99Ms, r.Duplicates)

	panel(&b, left, top1, int(plotW), panelH, maxRate, "payouts per second", n)
	y1 := func(v float64) float64 { return float64(top1+panelH) - float64(panelH)*v/maxRate }
	bw := plotW / float64(n)
	for i, s := range r.Timeline {
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#9ecae1"/>`+"\n",
			x(float64(i))+bw*0.1, y1(float64(s.Done)), bw*0.8, float64(top1+panelH)-y1(float64(s.Done)))
	}
	polyline(&b, n, x, func(i int) float64 { return y1(float64(r.Timeline[i].Created)) }, "#e6550d")
	legend(&b, left+10, top1+14, "#9ecae1", "completed")
	legend(&b, left+110, top1+14, "#e6550d", "created")

	panel(&b, left, top2, int(plotW), panelH, maxLat, "latency created to terminal (ms)", n)
	y2 := func(v float64) float64 { return float64(top2+panelH) - float64(panelH)*v/maxLat }
	polyline(&b, n, x, func(i int) float64 { return y2(r.Timeline[i].P50Ms) }, "#31a354")
	polyline(&b, n, x, func(i int) float64 { return y2(r.Timeline[i].P99Ms) }, "#756bb1")
	legend(&b, left+10, top2+14, "#31a354", "p50")
	legend(&b, left+110, top2+14, "#756bb1", "p99")
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">seconds since the first payout was created</text>`+"\n", left+int(plotW)/2, height-8)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// panel draws a frame with a y axis from 0 to maxV and an x axis of n seconds.
func panel(b *strings.Builder, x0, y0, w, h int, maxV float64, label string, n int) {
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", x0, y0, w, h)
	for k := 0; k <= 4; k++ {
		v := maxV * float64(k) / 4
		y := float64(y0+h) - float64(h)*float64(k)/4
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x0+w, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", x0-6, y+4, v)
	}
	step := max(1, n/10)
	for i := 0; i <= n; i += step {
		xx := float64(x0) + float64(w)*float64(i)/float64(n)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", xx, y0+h+14, i)
	}
	fmt.Fprintf(b, `<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>`+"\n", y0+h/2, y0+h/2, label)
}

func polyline(b *strings.Builder, n int, x func(float64) float64, y func(int) float64, color string) {
	b.WriteString(`<polyline fill="none" stroke="` + color + `" stroke-width="2" points="`)
	for i := range n {
		fmt.Fprintf(b, "%.1f,%.1f ", x(float64(i)+0.5), y(i))
	}
	b.WriteString("\"/>\n")
}

func legend(b *strings.Builder, x, y int, color, text string) {
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, y-10, color, x+16, y, text)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}
