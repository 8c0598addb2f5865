package lab

import (
	"encoding/json"
	"testing"

	"github.com/rdrr/peer/kernels"
)

// FuzzDecodeResponse: a worker's answer is decoded strictly and never
// panics; what decodes re-encodes to an answer that decodes the same way.
func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(`{"class":{"Backend":"vulkan","Vendor":"10005","Device":"0000","Driver":"mesa"},"adapter":{},"error":"x","errKind":"gate"}`))
	f.Add([]byte(`{"class":{},"adapter":{},"result":{"Op":"softmax","Dims":[1,2],"Seed":3,"CandidateNs":[1,2,3],"BaselineNs":[1,2,3],"FloorNs":1}}`))
	f.Add([]byte(`{"class":{},"adapter":{},"report":{"Seed":1,"Shapes":[{"Dims":[1],"MaxError":0.5,"Tolerance":1}]}}`))
	f.Add([]byte(`{}{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(b)
		if err != nil {
			return
		}
		if r.Result != nil && len(r.Result.CandidateNs) > kernels.MaxRuns {
			t.Fatalf("%d runs accepted", len(r.Result.CandidateNs))
		}
		_ = r.err()
		again, err := json.Marshal(r)
		if err != nil {
			return // the adapter's JSON may hold values that do not round-trip; nothing uses them
		}
		if _, err := decodeResponse(again); err != nil {
			t.Fatalf("re-encoded answer refused: %v\n%s", err, again)
		}
	})
}
