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
			got, err := c.encode(tc.text, false)
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
		Merges: g.Merges, BOS: g.BOS, EOS: g.EOS, AddBOS: g.AddBOS, AddEOS: g.AddEOS, UNK: id(g.UNK), PAD: id(g.PAD)}, nil
}
