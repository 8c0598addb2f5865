package main

import (
	"slices"
	"testing"

	"github.com/rdrr/peer/experts"
)

// --special: the text of a control token becomes that token; without it
// the text is plain text.
func TestPromptTokensSpecial(t *testing.T) {
	unk := 0
	m := &experts.Manifest{Config: experts.Config{VocabSize: 7}, Tokenizer: &experts.Tokenizer{
		Model:  "llama",
		Tokens: []string{"<unk>", "<s>", "</s>", "▁", "a", "<|end|>", "<"},
		Scores: []float32{0, 0, 0, 0, -1, 0, -2},
		Types:  []int32{2, 3, 3, 1, 1, 3, 1},
		BOS:    1, EOS: 2, UNK: &unk,
	}}
	const end = 5
	_, plain, err := promptTokens(m, "a<|end|>", false)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(plain, end) {
		t.Errorf("without --special: %v holds the control token %d", plain, end)
	}
	_, spec, err := promptTokens(m, "a<|end|>", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(spec) == 0 || spec[len(spec)-1] != end {
		t.Errorf("with --special: %v; want it to end with the control token %d", spec, end)
	}
}
