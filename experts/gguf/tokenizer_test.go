package gguf

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestTokenizerFlags: add_bos_token and add_eos_token are read when
// present (nil when not), and refused when of another type or true
// without the token they add.
func TestTokenizerFlags(t *testing.T) {
	read := func(kv ...KV) (*Tokenizer, error) {
		return readTokenizer(t, append([]KV{
			{"tokenizer.ggml.model", "gpt2"},
			{"tokenizer.ggml.tokens", Array{TypeString, []string{"<s>", "a", "<pad>"}}},
		}, kv...))
	}
	flag := func(b *bool) string {
		if b == nil {
			return "absent"
		}
		return fmt.Sprint(*b)
	}
	tk, err := read()
	if err != nil {
		t.Fatal(err)
	}
	if tk.AddBOS != nil || tk.AddEOS != nil || tk.AddSpacePrefix != nil || tk.UNK != -1 || tk.PAD != -1 {
		t.Errorf("no keys: add_bos %s, add_eos %s, unk %d, pad %d; want absent, absent, -1, -1", flag(tk.AddBOS), flag(tk.AddEOS), tk.UNK, tk.PAD)
	}
	tk, err = read(KV{"tokenizer.ggml.bos_token_id", uint32(0)}, KV{"tokenizer.ggml.add_bos_token", true},
		KV{"tokenizer.ggml.add_eos_token", false}, KV{"tokenizer.ggml.padding_token_id", uint32(2)},
		KV{"tokenizer.ggml.unknown_token_id", uint32(1)}, KV{"tokenizer.ggml.add_space_prefix", false})
	if err != nil {
		t.Fatal(err)
	}
	if tk.AddBOS == nil || !*tk.AddBOS || tk.AddEOS == nil || *tk.AddEOS || tk.PAD != 2 || tk.UNK != 1 || tk.AddSpacePrefix == nil || *tk.AddSpacePrefix {
		t.Errorf("add_bos %s, add_eos %s, pad %d, unk %d; want true, false, 2, 1", flag(tk.AddBOS), flag(tk.AddEOS), tk.PAD, tk.UNK)
	}
	for name, kv := range map[string][]KV{
		"add_bos a uint8":        {{"tokenizer.ggml.add_bos_token", uint8(1)}},
		"add_eos a string":       {{"tokenizer.ggml.add_eos_token", "true"}},
		"add_space_prefix a u32": {{"tokenizer.ggml.add_space_prefix", uint32(0)}},
		"add_bos without bos":    {{"tokenizer.ggml.add_bos_token", true}},
		"add_eos without eos":    {{"tokenizer.ggml.add_eos_token", true}},
		"pad past the vocab":     {{"tokenizer.ggml.padding_token_id", uint32(3)}},
		"unk negative":           {{"tokenizer.ggml.unknown_token_id", int32(-1)}},
		"unk far past the vocab": {{"tokenizer.ggml.unknown_token_id", uint64(1 << 40)}},
	} {
		if _, err := read(kv...); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v; want ErrFormat", name, err)
		}
	}
}

// TestTokenizerStrip: no GGUF key says which tokens strip the whitespace
// next to them; LStrip and RStrip follow llama.cpp's rules for the model
// that general.name, general.architecture and tokenizer.ggml.pre name.
func TestTokenizerStrip(t *testing.T) {
	// Phi-3's shape: <unk> and <s> control, </s> user-defined, the chat
	// tokens control, padding unknown.
	tokens := []string{"<unk>", "<s>", "</s>", "a", "<|endoftext|>", "<|user|>", "<|end|>", "[PAD7]", "<mask>", "[MASK]"}
	types := []int32{3, 3, 4, 1, 3, 3, 3, 2, 3, 3}
	read := func(kv ...KV) *Tokenizer {
		t.Helper()
		tk, err := readTokenizer(t, append([]KV{
			{"tokenizer.ggml.model", "llama"},
			{"tokenizer.ggml.tokens", Array{TypeString, tokens}},
			{"tokenizer.ggml.token_type", Array{TypeInt32, types}},
		}, kv...))
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	for _, tc := range []struct {
		name           string
		kv             []KV
		lstrip, rstrip []int
	}{
		{"no name", nil, nil, nil},
		{"llama", []KV{{"general.name", "Llama-3"}}, nil, nil},
		// Every unknown, control or user-defined token and </s>, less
		// <unk>, <s> and <|endoftext|>: </s>, <|user|>, <|end|>, [PAD7],
		// <mask>, [MASK].
		{"phi3", []KV{{"general.name", "Phi3"}}, nil, []int{2, 5, 6, 7, 8, 9}},
		{"Phi-3-mini", []KV{{"general.name", "Phi-3-mini-4k-instruct"}}, nil, []int{2, 5, 6, 7, 8, 9}},
		{"phi-2", []KV{{"general.name", "phi-2"}}, nil, nil},
		{"jina pre", []KV{{"tokenizer.ggml.pre", "jina-v2-es"}, {"general.name", "phi3"}}, []int{8}, nil}, // the first rule wins
		{"jina-bert-v3", []KV{{"general.architecture", "jina-bert-v3"}}, []int{8}, nil},
		{"nomic-bert-moe", []KV{{"general.architecture", "nomic-bert-moe"}}, []int{8}, nil},
		{"modern-bert", []KV{{"general.name", "Modern-BERT-base"}}, []int{9}, nil},
		// A name of another type selects nothing.
		{"name not a string", []KV{{"general.name", uint32(3)}}, nil, nil},
	} {
		tk := read(tc.kv...)
		if !slices.Equal(tk.LStrip, tc.lstrip) || !slices.Equal(tk.RStrip, tc.rstrip) {
			t.Errorf("%s: lstrip %v, rstrip %v; want %v, %v", tc.name, tk.LStrip, tk.RStrip, tc.lstrip, tc.rstrip)
		}
	}

	// A rule's token the vocabulary lacks is left out; without types no
	// token is special, and only </s> strips.
	for name, tc := range map[string]struct {
		tokens []string
		types  []int32
		rstrip []int
	}{
		"no </s>":  {[]string{"<unk>", "a", "<|end|>"}, []int32{2, 1, 3}, []int{2}},
		"no types": {[]string{"a", "</s>", "<|end|>"}, nil, []int{1}},
	} {
		kv := []KV{{"tokenizer.ggml.model", "llama"}, {"tokenizer.ggml.tokens", Array{TypeString, tc.tokens}}, {"general.name", "phi3"}}
		if tc.types != nil {
			kv = append(kv, KV{"tokenizer.ggml.token_type", Array{TypeInt32, tc.types}})
		}
		tk, err := readTokenizer(t, kv)
		if err != nil {
			t.Fatal(err)
		}
		if tk.LStrip != nil || !slices.Equal(tk.RStrip, tc.rstrip) {
			t.Errorf("%s: lstrip %v, rstrip %v; want none, %v", name, tk.LStrip, tk.RStrip, tc.rstrip)
		}
	}
}
