package gguf

import (
	"slices"
	"strings"
)

// Token types of tokenizer.ggml.token_type that llama.cpp looks for in
// a prompt's text before the tokenizer runs (its special tokens cache):
// unknown (2), control (3) and user-defined (4).
const (
	typeUnknown     = 2
	typeControl     = 3
	typeUserDefined = 4
)

// stripRules returns the ids, ascending, of the tokens whose whitespace
// on the left (lstrip) or on the right (rstrip) llama.cpp drops where it
// finds them in a prompt's text: its token attributes LSTRIP and RSTRIP
// (Hugging Face's added tokens' lstrip and rstrip).
//
// A GGUF file carries no such attribute: llama.cpp's converter keeps
// only the token types, and llama.cpp's loader (src/llama-vocab.cpp, at
// the end of load) sets the two attributes by model, from general.name,
// general.architecture and tokenizer.ggml.pre. Its rules, the first that
// applies:
//
//   - pre containing jina-v2-de, jina-v2-es or jina-v2-code, or an
//     architecture containing nomic-bert-moe or jina-bert-v3: "<mask>"
//     strips on the left;
//   - a name containing phi-3 or phi3 (ASCII case ignored): every token
//     of type unknown, control or user-defined, and "</s>", strip on the
//     right, except "<unk>", "<s>" and "<|endoftext|>" (Phi-3's
//     tokenizer.json has rstrip on exactly those);
//   - a name containing modern-bert: "[MASK]" strips on the left.
//
// A token a rule names that the vocabulary lacks is left out (llama.cpp
// warns, or for phi-3 refuses the file); where two tokens have the same
// text, the rule names the last. llama.cpp also gives the control type,
// by their text, to a few tokens the file types otherwise (a normal
// "<|end|>", say) before the phi-3 rule runs; the Phi-3 files checked
// type all theirs as control or user-defined, so that is not done here.
func stripRules(name, arch, pre string, tokens []string, types []int32) (lstrip, rstrip []int) {
	last := func(text string) int {
		for id := len(tokens) - 1; id >= 0; id-- {
			if tokens[id] == text {
				return id
			}
		}
		return -1
	}
	one := func(text string) []int {
		if id := last(text); id >= 0 {
			return []int{id}
		}
		return nil
	}
	name = asciiLower(name)
	switch {
	case containsAny(pre, "jina-v2-de", "jina-v2-es", "jina-v2-code") || containsAny(arch, "nomic-bert-moe", "jina-bert-v3"):
		return one("<mask>"), nil
	case containsAny(name, "phi-3", "phi3"):
		for id, typ := range types {
			if typ == typeUnknown || typ == typeControl || typ == typeUserDefined {
				rstrip = append(rstrip, id)
			}
		}
		if id := last("</s>"); id >= 0 {
			rstrip = append(rstrip, id)
		}
		slices.Sort(rstrip)
		rstrip = slices.Compact(rstrip)
		for _, s := range []string{"<unk>", "<s>", "<|endoftext|>"} {
			if id := last(s); id >= 0 {
				if k, found := slices.BinarySearch(rstrip, id); found {
					rstrip = slices.Delete(rstrip, k, k+1)
				}
			}
		}
		if len(rstrip) == 0 {
			rstrip = nil
		}
		return nil, rstrip
	case strings.Contains(name, "modern-bert"):
		return one("[MASK]"), nil
	}
	return nil, nil
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// asciiLower lowercases ASCII letters only, as C's tolower does in
// llama.cpp (other bytes stay as they are).
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}
