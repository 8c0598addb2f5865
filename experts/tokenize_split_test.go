package experts

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

// goldenPres are the pre-tokenizers testdata/presplit.json holds splits
// for, under these names.
var goldenPres = []string{"gpt2", "llama-bpe", "qwen2", "deepseek-v3", "starcoder", "falcon", "deepseek-llm", "deepseek-coder"}

func splitWith(name, text string) []string {
	var got []string
	preTokenizers[name].split(text, func(w string) bool { got = append(got, w); return true })
	return got
}

// TestTokenizePreSplitGolden checks each split against its pattern:
// testdata/presplit.json holds 300 texts and their pieces as Python's
// regex module cuts them with llama.cpp's patterns (testdata/presplit.py
// writes it: `python3 presplit.py > presplit.json` in testdata).
func TestTokenizePreSplitGolden(t *testing.T) {
	b, err := os.ReadFile("testdata/presplit.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []map[string]json.RawMessage
	if err := json.Unmarshal(b, &cases); err != nil || len(cases) < 250 {
		t.Fatalf("%d cases, %v", len(cases), err)
	}
	differ := map[string]int{} // texts a split cuts otherwise than GPT-2's
	for _, c := range cases {
		var text string
		if err := json.Unmarshal(c["text"], &text); err != nil {
			t.Fatal(err)
		}
		var gpt2 []string
		for _, name := range goldenPres {
			var want []string
			if err := json.Unmarshal(c[name], &want); err != nil || want == nil {
				t.Fatalf("%q: %s: %v", text, name, err)
			}
			if got := splitWith(name, text); !slices.Equal(got, want) {
				t.Errorf("%s: split(%q) = %q; want %q", name, text, got, want)
			}
			if name == "gpt2" {
				gpt2 = want
			} else if !slices.Equal(want, gpt2) {
				differ[name]++
			}
		}
	}
	// The texts must tell the splits apart, or the test proves little.
	for _, name := range goldenPres[1:] {
		if differ[name] < 50 {
			t.Errorf("%s cuts only %d texts otherwise than gpt2; the golden texts do not stress it", name, differ[name])
		}
	}
}

// TestTokenizePreSplit pins, by hand, what each split does with the
// cases the golden file cannot hold (invalid UTF-8) or that show a rule.
func TestTokenizePreSplit(t *testing.T) {
	for _, tc := range []struct {
		pre, in string
		want    []string
	}{
		// Contractions: any ASCII case for Llama 3, lowercase for GPT-2;
		// U+017F (ſ) is no s (llama.cpp's '[sS]; (?i:'s) would take it).
		{"llama-bpe", "I'M", []string{"I", "'M"}},
		{"gpt2", "I'M", []string{"I", "'", "M"}},
		{"llama-bpe", "'ſa", []string{"'ſa"}},
		// Numbers: in threes, one by one, or in one run.
		{"llama-bpe", "x1234567", []string{"x", "123", "456", "7"}},
		{"qwen2", "x123", []string{"x", "1", "2", "3"}},
		{"deepseek-v3", "x1234", []string{"x", "123", "4"}},
		{"gpt2", "x 1234", []string{"x", " 1234"}},
		// One non-letter before a word joins it (not \r or \n).
		{"llama-bpe", "a\tb", []string{"a", "\tb"}},
		{"llama-bpe", "\nb", []string{"\n", "b"}},
		// Punctuation takes the line breaks after it; spaces before a
		// line break go with it.
		{"llama-bpe", "x.\r\n\r\ny", []string{"x", ".\r\n\r\n", "y"}},
		{"qwen2", "x  \n  y", []string{"x", "  \n", " ", " y"}},
		// Invalid UTF-8: a symbol, as llama.cpp's U+FFFD.
		{"llama-bpe", "\xffabc", []string{"\xffabc"}},
		{"deepseek-v3", "\xffabc", []string{"\xff", "abc"}},
		{"deepseek-v3", "a\xff\xfe 1", []string{"a", "\xff\xfe", " ", "1"}},
		// DeepSeek-V3: a later pattern sees only its piece, so spaces
		// before a number end their piece whole.
		{"deepseek-v3", "a  1", []string{"a", "  ", "1"}},
		{"llama-bpe", "a  1", []string{"a", " ", " ", "1"}},
		// ASCII punctuation joins ASCII letters only; marks join letters.
		{"deepseek-v3", "'Hello.éa", []string{"'Hello", ".", "éa"}},
		{"deepseek-v3", "e\u0301x", []string{"e\u0301x"}},
		{"deepseek-v3", "\u0301", []string{"\u0301"}},
		// CJK of its ranges apart from the rest (한 is a letter outside them).
		{"deepseek-v3", "日本語abc한국", []string{"日本語", "abc한국"}},
		{"deepseek-v3", "x日本", []string{"x", "日本"}},
		// What no alternative matches stays together as one piece.
		{"deepseek-v3", "a\x01\x01", []string{"a", "\x01\x01"}},
		{"deepseek-v3", "~x", []string{"~x"}},
		{"deepseek-v3", "~é", []string{"~", "é"}}, // llama.cpp: one piece (its ~ is neither P nor S)
		{"deepseek-v3", "€~", []string{"€~"}},
		// StarCoder: each number character apart, then GPT-2's pattern.
		{"starcoder", "x 12½", []string{"x", " ", "1", "2", "½"}},
		// Falcon: punctuation runs apart, then GPT-2's, then ASCII digits
		// in threes from the left.
		{"falcon", "a, b!!c 12345", []string{"a", ",", " b", "!!", "c", " ", "123", "45"}},
		// DeepSeek-LLM: \r and \n alone; one space of any kind joins the
		// cased letters or the punctuation after it; trailing spaces of a
		// piece apart; invalid UTF-8 is no letter; U+0800 to U+9FA5 (U+3000
		// too) are "CJK".
		{"deepseek-llm", "a\r\n\u00a0b ,x\xff 12", []string{"a", "\r", "\n", "\u00a0b", " ,", "x", "\xff ", "12"}},
		{"deepseek-llm", "\u3000b", []string{"\u3000", "b"}},
		{"deepseek-llm", "x 1  ", []string{"x", " ", "1", "  "}},
		{"deepseek-coder", "x 12 ", []string{"x", " ", "1", "2", " "}},
	} {
		if got := splitWith(tc.pre, tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("%s: split(%q) = %q; want %q", tc.pre, tc.in, got, tc.want)
		}
	}
	// Every name of the table splits as the golden name llama.cpp gives
	// it the pattern of, on a text that tells the golden ones apart.
	const probe = "I'M 1234 日本~é\x01a  1"
	want := map[string]string{
		"gpt2": "gpt2", "gpt-2": "gpt2",
		"llama-bpe": "llama-bpe", "llama3": "llama-bpe", "llama-v3": "llama-bpe", "falcon3": "llama-bpe", "dbrx": "llama-bpe", "smaug-bpe": "llama-bpe",
		"qwen2": "qwen2", "deepseek-r1-qwen": "qwen2", "stablelm2": "qwen2",
		"deepseek-v3": "deepseek-v3", "hunyuan-dense": "deepseek-v3", "joyai-llm": "deepseek-v3",
		"mpt": "gpt2", "olmo": "gpt2", "jais": "gpt2", "phi-2": "gpt2", "roberta-bpe": "gpt2", "gigachat": "gpt2",
		"jina-es": "gpt2", "jina-de": "gpt2", "jina-v1-en": "gpt2", "jina-v2-es": "gpt2", "jina-v2-de": "gpt2", "jina-v2-code": "gpt2",
		"starcoder": "starcoder", "refact": "starcoder", "command-r": "starcoder", "smollm": "starcoder",
		"codeshell": "starcoder", "exaone": "starcoder", "minerva-7b": "starcoder",
		"megrez": "qwen2", "falcon": "falcon", "deepseek-llm": "deepseek-llm", "deepseek-coder": "deepseek-coder",
	}
	if len(want) != len(preTokenizers) {
		t.Errorf("the table has %d names, this test %d", len(preTokenizers), len(want))
	}
	for name, golden := range want {
		if _, ok := preTokenizers[name]; !ok {
			t.Errorf("%s: not in the table", name)
			continue
		}
		for _, other := range goldenPres {
			if same := slices.Equal(splitWith(name, probe), splitWith(other, probe)); same != (other == golden) {
				t.Errorf("%s splits the probe like %s: %v; want %v", name, other, same, other == golden)
			}
		}
	}
}

// TestTokenizePreSplitStop checks that a split stops when yield says so.
func TestTokenizePreSplitStop(t *testing.T) {
	for _, name := range goldenPres {
		n := 0
		preTokenizers[name].split("a b 1 2 日本 x", func(string) bool { n++; return n < 2 })
		if n != 2 {
			t.Errorf("%s: yield called %d times after returning false at 2", name, n)
		}
	}
}

func TestTokenizePreWarning(t *testing.T) {
	for _, tc := range []struct {
		model, pre string
		warn       string // a part of the warning; "" for none
	}{
		{"gpt2", "qwen2", ""},
		{"gpt2", "llama-bpe", ""},
		{"gpt2", "deepseek-v3", ""},
		{"gpt2", "gpt-2", ""},
		{"gpt2", "tekken", `"tekken" is not known`},
		{"gpt2", "", "names no pre-tokenizer"},
		{"llama", "", ""}, // SentencePiece does not pre-split
	} {
		tk := gpt2Vocab("Ġ t", "h e", "t h", "Ġt he")
		if tc.model == "llama" {
			tk = spmVocab([]string{"▁", "a"}, []float32{0, 0}, nil)
		}
		tk.Pre = tc.pre
		c := newCodec(t, tk)
		w := c.Warning()
		if tc.warn == "" && w != "" || tc.warn != "" && !strings.Contains(w, tc.warn) {
			t.Errorf("%s/%q: Warning() = %q; want %q", tc.model, tc.pre, w, tc.warn)
		}
		// An unknown name still encodes, as GPT-2 would.
		if tc.model == "gpt2" && tc.warn != "" {
			ids, err := c.Encode("the 12")
			if want := []string{"t", "he", "Ġ", "1", "2"}; err != nil || !slices.Equal(texts(tk, ids), want) {
				t.Errorf("%q: Encode = %q, %v; want %q", tc.pre, texts(tk, ids), err, want)
			}
		}
	}
}
