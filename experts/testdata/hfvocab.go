//go:build ignore

// hfvocab writes a tokenizer-only GGUF file (as llama.cpp's
// models/ggml-vocab-NAME.gguf) from a Hugging Face tokenizer.json of a
// byte-level BPE model, for TestLlamaVocab where llama.cpp's own file is
// not to be had (its large vocabularies are Git LFS objects):
//
//	go run experts/testdata/hfvocab.go -pre llama-bpe tokenizer.json ggml-vocab-llama-bpe.gguf
//
// It assigns tokens and types as llama.cpp's convert_hf_to_gguf.py
// (get_vocab_base, does_token_look_special) does: the model's vocabulary
// as it is (byte-level text), added tokens as their content, CONTROL
// where the added token is special or looks special (<|...|>, <｜...｜>,
// <pad>, <mask>, <unused...>), USER_DEFINED otherwise (with "▁" as a
// space), NORMAL for the rest, and "[PADn]" of type UNUSED for ids no
// token has. It does not run the Hugging Face tokenizer, so an added
// token that is not "normalized" is taken as it is, where convert_hf_to_gguf
// would encode and decode it first (the same text for the tokenizers
// this is used with).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/rdrr/peer/experts/gguf"
)

// llama.cpp's llama_token_type.
const (
	typeNormal      = 1
	typeControl     = 3
	typeUserDefined = 4
	typeUnused      = 5
)

type tokenizerJSON struct {
	Model struct {
		Type   string            `json:"type"`
		Vocab  map[string]int    `json:"vocab"`
		Merges []json.RawMessage `json:"merges"` // "a b", or ["a", "b"]
	} `json:"model"`
	AddedTokens []struct {
		ID      int    `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
}

func main() {
	pre := flag.String("pre", "", "tokenizer.ggml.pre (llama-bpe, qwen2, deepseek-v3, ...)")
	flag.Parse()
	if flag.NArg() != 2 || *pre == "" {
		fmt.Fprintln(os.Stderr, "usage: go run hfvocab.go -pre NAME tokenizer.json out.gguf")
		os.Exit(2)
	}
	b, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		log.Fatal(err)
	}
	var tj tokenizerJSON
	if err := json.Unmarshal(b, &tj); err != nil {
		log.Fatal(err)
	}
	if tj.Model.Type != "BPE" {
		log.Fatalf("model type %q: only BPE is converted", tj.Model.Type)
	}
	const maxVocab = 1 << 20
	n := 0
	for _, id := range tj.Model.Vocab {
		if id < 0 || id >= maxVocab {
			log.Fatalf("token id %d out of range", id)
		}
		n = max(n, id+1)
	}
	for _, a := range tj.AddedTokens {
		if a.ID < 0 || a.ID >= maxVocab {
			log.Fatalf("added token id %d out of range", a.ID)
		}
		n = max(n, a.ID+1)
	}
	tokens := make([]string, n)
	types := make([]int32, n)
	for i := range tokens {
		tokens[i], types[i] = fmt.Sprintf("[PAD%d]", i), typeUnused
	}
	for s, id := range tj.Model.Vocab {
		tokens[id], types[id] = s, typeNormal
	}
	for _, a := range tj.AddedTokens {
		if a.Special || looksSpecial(a.Content) {
			tokens[a.ID], types[a.ID] = a.Content, typeControl
		} else {
			tokens[a.ID], types[a.ID] = strings.ReplaceAll(a.Content, "\u2581", " "), typeUserDefined
		}
	}
	merges := make([]string, len(tj.Model.Merges))
	for i, raw := range tj.Model.Merges {
		var s string
		var pair []string
		switch {
		case json.Unmarshal(raw, &s) == nil:
			merges[i] = s
		case json.Unmarshal(raw, &pair) == nil && len(pair) == 2:
			merges[i] = pair[0] + " " + pair[1]
		default:
			log.Fatalf("merge %d: %s", i, raw)
		}
	}
	kv := []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "general.name", Value: *pre},
		{Key: "tokenizer.ggml.model", Value: "gpt2"},
		{Key: "tokenizer.ggml.pre", Value: *pre},
		{Key: "tokenizer.ggml.tokens", Value: gguf.Array{Type: gguf.TypeString, Values: tokens}},
		{Key: "tokenizer.ggml.token_type", Value: gguf.Array{Type: gguf.TypeInt32, Values: types}},
		{Key: "tokenizer.ggml.merges", Value: gguf.Array{Type: gguf.TypeString, Values: merges}},
	}
	var buf bytes.Buffer
	if err := gguf.Write(&buf, kv, nil, 0); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(flag.Arg(1), buf.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
}

// looksSpecial is convert_hf_to_gguf.py's does_token_look_special: added
// tokens that some models do not mark special but that are control tokens.
func looksSpecial(s string) bool {
	switch s {
	case "<pad>", "<mask>", "<2mass>", "[@BOS@]":
		return true
	}
	return strings.HasPrefix(s, "<|") && strings.HasSuffix(s, "|>") ||
		strings.HasPrefix(s, "<｜") && strings.HasSuffix(s, "｜>") ||
		strings.HasPrefix(s, "<unused") && strings.HasSuffix(s, ">")
}
