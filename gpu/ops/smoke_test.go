package ops

import "testing"

func TestCompileAllBuiltins(t *testing.T) {
	if err := shared.k.Prepare(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}
