package gguf

import (
	"errors"
	"fmt"
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
