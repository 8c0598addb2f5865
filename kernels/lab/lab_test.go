package lab

import (
	"testing"
	"time"

	"github.com/rdrr/peer/kernels"
)

// testShape is the shape the tests time op on: its default shape, or a
// smaller one where that takes lavapipe long (`peer kernels bench all`
// times the default shapes).
func testShape(op string) []int {
	switch op {
	case "attention_decode":
		return []int{32, 8, 128, 300}
	case "q4k_matvec":
		return []int{1024, 4096}
	case "q4k_matmul":
		return []int{256, 4096, 8}
	case "q4k_matvec_group":
		return []int{2, 512, 4096}
	case "q4k_dequant":
		return []int{1 << 18}
	}
	return DefaultShape(op)
}

// Every built-in passes the gate, and against itself times a speedup
// near 1 above the roofline floor.
func TestBuiltinsPassGate(t *testing.T) {
	l := &Lab{Dev: testDev}
	bs := builtins(t)
	for _, op := range Ops() {
		t.Run(op, func(t *testing.T) {
			rep, err := l.Check(ctxT(t, 2*time.Minute), bs[op], 42)
			if err != nil {
				t.Fatalf("gate: %v", err)
			}
			if len(rep.Shapes) < 5 {
				t.Fatalf("gate ran %d shapes; want several", len(rep.Shapes))
			}
			res, err := l.Compare(ctxT(t, 2*time.Minute), bs[op], bs[op], testShape(op), kernels.BenchOptions{Runs: 9, Seed: 7})
			if err != nil {
				t.Fatalf("compare: %v", err)
			}
			s, err := kernels.Summarize(res)
			if err != nil {
				t.Fatalf("summarize: %v", err)
			}
			t.Logf("%s %v: %d ns vs %d ns, speedup %.3f [%.3f, %.3f], floor %d ns", op, res.Dims, s.CandidateNs, s.BaselineNs, s.Median, s.Low, s.High, res.FloorNs)
			// No bound on the speedup itself: timings on a shared machine
			// are for benchmarks, not tests. The summary must be sane.
			if !(s.Median > 0 && s.Low <= s.Median && s.Median <= s.High) || s.CandidateNs <= 0 || s.BaselineNs <= 0 {
				t.Errorf("built-in against itself: %+v", s)
			}
		})
	}
}
