package experts

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// spmVocab is a toy SentencePiece vocabulary: <unk>, <s>, </s>, the
// given pieces (scores as given) and byte tokens for the bytes listed
// (all 256 for nil).
func spmVocab(pieces []string, scores []float32, bytes []byte) *Tokenizer {
	t := &Tokenizer{Model: "llama", BOS: 1, EOS: 2,
		Tokens: []string{"<unk>", "<s>", "</s>"}, Scores: []float32{0, 0, 0}, Types: []int32{2, 3, 3}}
	t.Tokens = append(t.Tokens, pieces...)
	t.Scores = append(t.Scores, scores...)
	for range pieces {
		t.Types = append(t.Types, 1)
	}
	if bytes == nil {
		for b := range 256 {
			bytes = append(bytes, byte(b))
		}
	}
	for _, b := range bytes {
		t.Tokens = append(t.Tokens, fmt.Sprintf("<0x%02X>", b))
		t.Scores = append(t.Scores, 0)
		t.Types = append(t.Types, 6)
	}
	return t
}

// gpt2Vocab is a toy byte-level BPE vocabulary: the 256 mapped bytes
// (id = byte), then <|endoftext|> (256, control), then the merges'
// results in order.
func gpt2Vocab(merges ...string) *Tokenizer {
	t := &Tokenizer{Model: "gpt2", BOS: 256, EOS: 256, Merges: merges}
	for b := range 256 {
		t.Tokens = append(t.Tokens, byteToUnicode[b])
		t.Types = append(t.Types, 1)
	}
	t.Tokens = append(t.Tokens, "<|endoftext|>")
	t.Types = append(t.Types, 3)
	for _, m := range merges {
		t.Tokens = append(t.Tokens, strings.Replace(m, " ", "", 1))
		t.Types = append(t.Types, 1)
	}
	return t
}

func newCodec(t *testing.T, tk *Tokenizer) *TokenCodec {
	t.Helper()
	c, err := NewTokenCodec(tk)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// texts names tokens by their text, for the messages.
func texts(tk *Tokenizer, ids []int) []string {
	var s []string
	for _, id := range ids {
		s = append(s, tk.Tokens[id])
	}
	return s
}

// encodeCase is a text and the tokens it encodes to, by their text.
type encodeCase struct {
	in   string
	want []string
}

func checkEncode(t *testing.T, c *TokenCodec, tk *Tokenizer, cases []encodeCase) {
	t.Helper()
	for _, tc := range cases {
		ids, err := c.Encode(tc.in)
		if err != nil {
			t.Errorf("Encode(%q): %v", tc.in, err)
			continue
		}
		if got := texts(tk, ids); !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

func TestTokenizeSPM(t *testing.T) {
	// ids: 3 ▁, 4 a, 5 b, 6 c, 7 ab, 8 bc, 9 ▁a, 10 ▁ab, 11 aa, 12 ▁b;
	// byte tokens for 0xC3 (13), 0xA9 (14) and 0x0A (15) only.
	tk := spmVocab([]string{"▁", "a", "b", "c", "ab", "bc", "▁a", "▁ab", "aa", "▁b"},
		[]float32{-1, -1, -1, -1, -5, -2, -3, -4, 0, -1}, []byte{0xC3, 0xA9, 0x0A})
	c := newCodec(t, tk)
	checkEncode(t, c, tk, []encodeCase{
		// ▁ a b c: bc (-2) beats ▁a (-3) and ab (-5); then ▁a; ▁abc is no token.
		{"abc", []string{"<s>", "▁a", "bc"}},
		// aa at 1-2 and 2-3 tie: the leftmost merges.
		{"aaa", []string{"<s>", "▁", "aa", "a"}},
		// Spaces become ▁.
		{"a b", []string{"<s>", "▁a", "▁b"}},
		{" a", []string{"<s>", "▁", "▁a"}},
		// é has no token: its bytes; ü (C3 BC) has no byte token for BC: <unk>.
		{"é\n", []string{"<s>", "▁", "<0xC3>", "<0xA9>", "<0x0A>"}},
		{"aü", []string{"<s>", "▁a", "<unk>"}},
		// Invalid UTF-8: the byte alone; a control token's text is text.
		{"\xC3a", []string{"<s>", "▁", "<0xC3>", "a"}},
		{"", []string{"<s>"}},
	})
	// Text does not become a control token, even where merges lead to one.
	ctl := spmVocab([]string{"▁", "</", "s>", "▁</"}, []float32{0, 1, 1, -1}, nil)
	if ids, _ := newCodec(t, ctl).Encode("</s>"); !slices.Equal(texts(ctl, ids), []string{"<s>", "▁</", "s>"}) {
		t.Errorf("Encode(\"</s>\") = %q; want [<s> ▁</ s>]", texts(ctl, ids))
	}
	for _, tc := range []struct {
		ids  []int
		want string
	}{
		{[]int{1, 9, 8}, "abc"},
		{[]int{1, 3, 9}, " a"},
		{[]int{1, 9, 12, 2}, "a b"},
		{[]int{1, 3, 13, 14, 15}, "é\n"},
		{[]int{9, 0, 13}, "a\uFFFD\xC3"}, // unknown token; an unfinished byte sequence as it is
		{[]int{13, 9}, "\xC3 a"},         // a byte token first: no space to take off
	} {
		if got := c.Decode(tc.ids); got != tc.want {
			t.Errorf("Decode(%v) = %q; want %q", texts(tk, tc.ids), got, tc.want)
		}
	}
	// Without an unknown token, ü cannot be encoded.
	tk.Types[0] = 1
	tk.Tokens[0] = "x"
	if _, err := newCodec(t, tk).Encode("ü"); err == nil {
		t.Error("Encode of a character without a token, byte tokens or <unk> succeeded")
	}
}

func TestTokenizeGPT2(t *testing.T) {
	tk := gpt2Vocab("Ġ t", "h e", "t h", "Ġt he", "a b", "ab c")
	c := newCodec(t, tk)
	checkEncode(t, c, tk, []encodeCase{
		// t h e: "h e" (rank 1) before "t h" (rank 2); "t he" is no merge.
		{"the", []string{"t", "he"}},
		// Ġ t h e: Ġt (0), then he (1), then Ġthe (3).
		{" the", []string{"Ġthe"}},
		// One piece: ab (4), then abc (5); "e a" is no merge.
		{"theabc", []string{"t", "he", "abc"}},
		// Three pieces: merges stay within each.
		{"the'abc", []string{"t", "he", "'", "abc"}},
		{"the abc", []string{"t", "he", "Ġ", "abc"}},
		{"don't", []string{"d", "o", "n", "'", "t"}},
		{"é", []string{"Ã", "©"}},
		{"<|endoftext|>", []string{"<", "|", "e", "n", "d", "o", "f", "t", "e", "x", "t", "|", ">"}},
		{"", nil},
	})
	if got := c.Decode([]int{256, 256 + 1 + 3, 'x'}); got != " thex" {
		t.Errorf("Decode = %q; want \" thex\" (control token left out)", got)
	}
	// llama-bpe vocabularies get BOS.
	tk.Pre = "llama-bpe"
	if ids, _ := newCodec(t, tk).Encode("the"); len(ids) != 3 || ids[0] != 256 {
		t.Errorf("llama-bpe: Encode = %v; want BOS first", ids)
	}
	// A merge whose result is no token falls back to the bytes' tokens.
	tk = gpt2Vocab("a b")
	tk.Tokens = tk.Tokens[:len(tk.Tokens)-1]
	tk.Types = tk.Types[:len(tk.Types)-1]
	if ids, err := newCodec(t, tk).Encode("ab"); err != nil || !slices.Equal(ids, []int{'a', 'b'}) {
		t.Errorf("merge to no token: %v, %v; want [a b]", ids, err)
	}
}

func TestTokenizeGPT2Split(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"Hello world", []string{"Hello", " world"}},
		{"don't", []string{"don", "'t"}},
		{"I'll've'd'm's're", []string{"I", "'ll", "'ve", "'d", "'m", "'s", "'re"}},
		{"'S 'x", []string{"'", "S", " '", "x"}}, // contractions are lowercase, at a piece's start
		{"abc123 45", []string{"abc", "123", " 45"}},
		{"a  b", []string{"a", " ", " b"}},
		{"a   ", []string{"a", "   "}},
		{"a\n\nb", []string{"a", "\n", "\n", "b"}},
		{"a \n b", []string{"a", " \n", " b"}},
		{"hi!!! ?x", []string{"hi", "!!!", " ?", "x"}},
		{"héllo wörld ١٢", []string{"héllo", " wörld", " ١٢"}},
		{"x \u3000y", []string{"x", " ", "\u3000", "y"}},
		{"\xffa\xfe\xfd 1", []string{"\xff", "a", "\xfe\xfd", " 1"}},
		{" ", []string{" "}},
		{"'", []string{"'"}},
	} {
		var got []string
		splitGPT2(tc.in, func(w string) bool { got = append(got, w); return true })
		if !slices.Equal(got, tc.want) {
			t.Errorf("split(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

// TestTokenizeGPT2SplitRegex checks the split against the pattern itself:
// testdata/gpt2split.json holds random texts and their pieces as Python's
// regex module cuts them (regex.findall with GPT-2's pattern; the texts
// mix letters, digits, punctuation, contractions and Unicode spaces,
// letters and numbers).
func TestTokenizeGPT2SplitRegex(t *testing.T) {
	b, err := os.ReadFile("testdata/gpt2split.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Text   string
		Pieces []string
	}
	if err := json.Unmarshal(b, &cases); err != nil || len(cases) < 100 {
		t.Fatalf("%d cases, %v", len(cases), err)
	}
	for _, tc := range cases {
		var got []string
		splitGPT2(tc.Text, func(w string) bool { got = append(got, w); return true })
		if !slices.Equal(got, tc.Pieces) {
			t.Errorf("split(%q) = %q; want %q", tc.Text, got, tc.Pieces)
		}
	}
}

func TestTokenizeStream(t *testing.T) {
	tk := spmVocab([]string{"▁", "a"}, []float32{0, 0}, nil)
	c := newCodec(t, tk)
	b := func(x byte) int { return 5 + int(x) } // byte tokens follow ▁ and a
	d := c.NewDecoder()
	var got []string
	for _, id := range []int{3, b(0xE2), b(0x82), b(0xAC), 4, b(0xF0), b(0x9F)} {
		got = append(got, d.Next(id))
	}
	got = append(got, d.Flush())
	// A continuation keeps its leading space; € (E2 82 AC) comes out whole;
	// the unfinished F0 9F only at Flush.
	if want := []string{" ", "", "", "€", "a", "", "", "\xF0\x9F"}; !slices.Equal(got, want) {
		t.Errorf("stream = %q; want %q", got, want)
	}
	// An invalid byte is not held back.
	if s := d.Next(b(0xFF)); s != "\xFF" {
		t.Errorf("Next(<0xFF>) = %q", s)
	}
	if s := d.Next(b(0xC3)) + d.Next(b('a')); s != "\xC3a" {
		t.Errorf("C3 then a = %q", s)
	}
}

func TestTokenizeHostile(t *testing.T) {
	for _, tk := range []*Tokenizer{spmVocab([]string{"▁", "a", "aa"}, []float32{0, 0, 1}, nil), gpt2Vocab("a a", "aa aa")} {
		c := newCodec(t, tk)
		if _, err := c.Encode(strings.Repeat("a", MaxPromptBytes+1)); !errors.Is(err, ErrPromptTooLong) {
			t.Errorf("%s: a prompt over the limit: %v; want ErrPromptTooLong", tk.Model, err)
		}
		long := strings.Repeat("a", MaxPromptBytes)
		ids, err := c.Encode(long)
		if err != nil || c.Decode(ids) != long {
			t.Errorf("%s: a prompt at the limit: %d tokens, %v", tk.Model, len(ids), err)
		}
	}
	for _, tc := range []struct {
		name string
		edit func(*Tokenizer)
	}{
		{"model", func(t *Tokenizer) { t.Model = "bert" }},
		{"merge", func(t *Tokenizer) { t.Model = "gpt2"; t.Merges = []string{"a b", "abc"} }},
		{"short merge", func(t *Tokenizer) { t.Model = "gpt2"; t.Merges = []string{"a "} }},
		{"merge halves", func(t *Tokenizer) { t.Model = "gpt2"; t.Merges = []string{"ab "} }},
		{"scores", func(t *Tokenizer) { t.Scores = t.Scores[1:] }},
		{"byte token", func(t *Tokenizer) { t.Types[3] = 6 }},
		{"empty", func(t *Tokenizer) { t.Tokens, t.Scores, t.Types = nil, nil, nil; t.BOS, t.EOS = -1, -1 }},
	} {
		tk := spmVocab([]string{"▁", "a"}, []float32{0, 0}, nil)
		tc.edit(tk)
		if _, err := NewTokenCodec(tk); err == nil {
			t.Errorf("NewTokenCodec with a bad %s succeeded", tc.name)
		}
	}
	if _, err := NewTokenCodec(nil); err == nil {
		t.Error("NewTokenCodec(nil) succeeded")
	}
}

// roundTripCodecs are toy vocabularies that hold every byte.
func roundTripCodecs(t testing.TB) []*TokenCodec {
	var cs []*TokenCodec
	for _, tk := range []*Tokenizer{
		spmVocab([]string{"▁", "a", "b", "▁a", "ab", "é", "▁é"}, []float32{0, 0, 0, -1, -2, 0, -1}, nil),
		gpt2Vocab("Ġ a", "a b", "Ġa b", "Ã ©", "' s", "Ċ Ċ"),
	} {
		c, err := NewTokenCodec(tk)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	return cs
}

func FuzzTokenizeRoundTrip(f *testing.F) {
	for _, s := range []string{"", "a b", " ab  é", "don't\n\n", "\xff\xc3", "日本語 123", "a\u3000 b", "'s'S", "€"} {
		f.Add(s)
	}
	cs := roundTripCodecs(f)
	f.Fuzz(func(t *testing.T, s string) { checkRoundTrip(t, cs, s) })
}

func checkRoundTrip(t *testing.T, cs []*TokenCodec, s string) {
	for _, c := range cs {
		if c.spm && strings.Contains(s, spmSpace) {
			continue // ▁ decodes as a space: SentencePiece's text is not all text
		}
		ids, err := c.Encode(s)
		if err != nil {
			t.Fatalf("%s: Encode(%q): %v", c.t.Model, s, err)
		}
		if got := c.Decode(ids); got != s {
			t.Fatalf("%s: Decode(Encode(%q)) = %q (%q)", c.t.Model, s, got, texts(c.t, ids))
		}
		// The stream gives the same bytes, no character cut.
		d := c.NewDecoder()
		var parts []string
		for _, id := range ids {
			parts = append(parts, d.Next(id))
		}
		parts = append(parts, d.Flush())
		whole := strings.Join(parts, "")
		if c.spm {
			whole = strings.TrimPrefix(whole, " ")
		}
		if whole != s {
			t.Fatalf("%s: stream of Encode(%q) = %q", c.t.Model, s, parts)
		}
		if utf8.ValidString(s) {
			for _, p := range parts {
				if !utf8.ValidString(p) {
					t.Fatalf("%s: stream of %q cut a character: %q", c.t.Model, s, parts)
				}
			}
		}
	}
}
