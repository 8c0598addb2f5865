package gguf

// Tokenizer is a file's tokenizer.ggml.* metadata, checked for
// consistency. It holds the data only; encoding text is not this
// package's job.
type Tokenizer struct {
	Model  string    // tokenizer.ggml.model: llama (SentencePiece), gpt2 (BPE), ...
	Pre    string    // tokenizer.ggml.pre: the pre-tokenizer, if named
	Tokens []string  // tokenizer.ggml.tokens
	Scores []float32 // tokenizer.ggml.scores, one per token, or nil
	Types  []int32   // tokenizer.ggml.token_type, one per token, or nil
	Merges []string  // tokenizer.ggml.merges (BPE), or nil
	// Special token ids, -1 when absent.
	BOS, EOS, UNK, PAD int
	// tokenizer.ggml.add_bos_token, add_eos_token and add_space_prefix,
	// nil when absent.
	AddBOS, AddEOS, AddSpacePrefix *bool
	// LStrip and RStrip are the ids, ascending, of the tokens whose
	// whitespace on the left (right) llama.cpp drops where it finds them
	// in a prompt's text, nil for none. No GGUF key holds them: they are
	// llama.cpp's rules for the model that general.name,
	// general.architecture and tokenizer.ggml.pre name (stripRules).
	LStrip, RStrip []int
}

// Tokenizer returns the file's tokenizer, or nil if it has no
// tokenizer.ggml.tokens. A tokenizer key of the wrong type, a scores or
// types array whose length differs from the tokens', a special token id
// outside the vocabulary, or add_bos_token (add_eos_token) true without a
// BOS (EOS) token id is an ErrFormat naming the key.
func (f *File) Tokenizer() (*Tokenizer, error) {
	const p = "tokenizer.ggml."
	if _, ok := f.kv[p+"tokens"]; !ok {
		return nil, nil
	}
	tk := &Tokenizer{BOS: -1, EOS: -1, UNK: -1, PAD: -1}
	var ok bool
	if tk.Tokens, ok = f.Strings(p + "tokens"); !ok {
		return nil, formatErr("%stokens is not an array of strings", p)
	}
	n := len(tk.Tokens)
	for key, dst := range map[string]*string{"model": &tk.Model, "pre": &tk.Pre} {
		if v, present := f.kv[p+key]; present {
			if *dst, ok = v.(string); !ok {
				return nil, formatErr("%s%s is a %T, not a string", p, key, v)
			}
		}
	}
	if v, present := f.kv[p+"scores"]; present {
		a, _ := v.(Array)
		if tk.Scores, ok = a.Values.([]float32); !ok || len(tk.Scores) != n {
			return nil, formatErr("%sscores: want %d float32 (one per token)", p, n)
		}
	}
	if v, present := f.kv[p+"token_type"]; present {
		a, _ := v.(Array)
		if tk.Types, ok = a.Values.([]int32); !ok || len(tk.Types) != n {
			return nil, formatErr("%stoken_type: want %d int32 (one per token)", p, n)
		}
	}
	if _, present := f.kv[p+"merges"]; present {
		if tk.Merges, ok = f.Strings(p + "merges"); !ok {
			return nil, formatErr("%smerges is not an array of strings", p)
		}
	}
	for key, dst := range map[string]*int{"bos_token_id": &tk.BOS, "eos_token_id": &tk.EOS,
		"unknown_token_id": &tk.UNK, "padding_token_id": &tk.PAD} {
		if _, present := f.kv[p+key]; !present {
			continue
		}
		id, isInt := f.Uint(p + key)
		if !isInt || id >= uint64(n) {
			return nil, formatErr("%s%s = %#v (the vocabulary has %d tokens)", p, key, f.kv[p+key], n)
		}
		*dst = int(id)
	}
	for key, dst := range map[string]**bool{"add_bos_token": &tk.AddBOS, "add_eos_token": &tk.AddEOS, "add_space_prefix": &tk.AddSpacePrefix} {
		v, present := f.kv[p+key]
		if !present {
			continue
		}
		b, isBool := v.(bool)
		if !isBool {
			return nil, formatErr("%s%s is a %T, not a bool", p, key, v)
		}
		*dst = &b
	}
	// As llama.cpp, which refuses such a file: a token to add must exist.
	if tk.AddBOS != nil && *tk.AddBOS && tk.BOS < 0 {
		return nil, formatErr("%sadd_bos_token is true, but %sbos_token_id is not set", p, p)
	}
	if tk.AddEOS != nil && *tk.AddEOS && tk.EOS < 0 {
		return nil, formatErr("%sadd_eos_token is true, but %seos_token_id is not set", p, p)
	}
	// Names of another type count as absent: they only select the rules.
	name, _ := f.String("general.name")
	arch, _ := f.String("general.architecture")
	tk.LStrip, tk.RStrip = stripRules(name, arch, tk.Pre, tk.Tokens, tk.Types)
	return tk, nil
}
