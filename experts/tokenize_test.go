package experts

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rdrr/peer/experts/gguf"
	"golang.org/x/text/unicode/norm"
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
	if raceEnabled && testing.Short() {
		t.Skip("megabyte prompts on one goroutine, ten times slower under the race detector; the run without it (make test's first pass) covers it")
	}
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
		// User-defined tokens: found before the split, their text raw.
		withUserDefined(gpt2Vocab("Ġ a", "a b", "Ġa b", "Ã ©", "' s", "Ċ Ċ"), "<u>", "  ", "é", "a<u"),
	} {
		if tk.Model == "gpt2" {
			// Every split: Llama 3's (whole pieces taken as tokens), Qwen2's,
			// DeepSeek-V3's, DeepSeek-LLM's, StarCoder's, Falcon's, GPT-2's.
			for _, pre := range []string{"llama-bpe", "qwen2", "deepseek-v3", "deepseek-llm", "deepseek-coder", "starcoder", "falcon"} {
				v := *tk
				v.Pre = pre
				cs = append(cs, newCodecTB(t, &v))
			}
		}
		cs = append(cs, newCodecTB(t, tk))
		if tk.Model == "llama" {
			// Without the "▁" in front (Gemma's add_space_prefix false).
			v, no := *tk, false
			v.AddSpacePrefix = &no
			cs = append(cs, newCodecTB(t, &v))
		}
	}
	// Tokens that strip the whitespace next to them: <u> on its right,
	// a<u on its left, the control <c> (EncodeSpecial's) on both. No
	// token starts or ends with whitespace (stripReference needs that).
	tk := withUserDefined(gpt2Vocab("Ġ a", "a b", "Ċ Ċ"), "<u>", "é", "a<u")
	ctl := withTyped(tk, tokenControl, "<c>")
	n := len(tk.Tokens)
	tk.LStrip, tk.RStrip = []int{n - 2, ctl[0]}, []int{n - 4, ctl[0]}
	return append(cs, newCodecTB(t, tk))
}

func newCodecTB(t testing.TB, tk *Tokenizer) *TokenCodec {
	c, err := NewTokenCodec(tk)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func FuzzTokenizeRoundTrip(f *testing.F) {
	for _, s := range []string{"", "a b", " ab  é", "don't\n\n", "\xff\xc3", "日本語 123", "a\u3000 b", "'s'S", "€", "a\x01\x01b 1234~é\r\n  ", "a<u>b <u a<u>",
		"x <u>\n\ty a<u  z <c>\v\f", "\t<c> <u> a<u\r\n"} {
		f.Add(s)
	}
	cs := roundTripCodecs(f)
	f.Fuzz(func(t *testing.T, s string) { checkRoundTrip(t, cs, s) })
}

func checkRoundTrip(t *testing.T, cs []*TokenCodec, s string) {
	// Each split cuts the text into non-empty pieces that are all of it.
	for name, p := range preTokenizers {
		var b strings.Builder
		p.split(s, func(w string) bool {
			if w == "" {
				t.Fatalf("%s: split(%q) gave an empty piece", name, s)
			}
			b.WriteString(w)
			return true
		})
		if b.String() != s {
			t.Fatalf("%s: split(%q) pieces make %q", name, s, b.String())
		}
	}
	for _, c := range cs {
		if c.spm && strings.Contains(s, spmSpace) {
			continue // ▁ decodes as a space: SentencePiece's text is not all text
		}
		ids, err := c.Encode(s)
		if err != nil {
			t.Fatalf("%s/%s: Encode(%q): %v", c.t.Model, c.t.Pre, s, err)
		}
		want := nfcBetweenUserTokens(c, s)
		if c.user != nil && c.user.strip != nil {
			want = stripReference(c, s)
		}
		if got := c.Decode(ids); got != want {
			t.Fatalf("%s/%s: Decode(Encode(%q)) = %q (%q)", c.t.Model, c.t.Pre, s, got, texts(c.t, ids))
		}
		// The stream gives the same bytes, no character cut.
		d := c.NewDecoder()
		var parts []string
		for _, id := range ids {
			parts = append(parts, d.Next(id))
		}
		parts = append(parts, d.Flush())
		whole := strings.Join(parts, "")
		if c.spacePrefix {
			whole = strings.TrimPrefix(whole, " ")
		}
		if whole != want {
			t.Fatalf("%s: stream of Encode(%q) = %q", c.t.Model, s, parts)
		}
		if utf8.ValidString(s) {
			for _, p := range parts {
				if !utf8.ValidString(p) {
					t.Fatalf("%s: stream of %q cut a character: %q", c.t.Model, s, parts)
				}
			}
		}
		// EncodeSpecial is Encode where the text spells no token that
		// only it looks for.
		special, err := c.EncodeSpecial(s)
		if err != nil {
			t.Fatalf("%s/%s: EncodeSpecial(%q): %v", c.t.Model, c.t.Pre, s, err)
		}
		if !spellsSpecial(c, s) && !slices.Equal(special, ids) {
			t.Fatalf("%s/%s: EncodeSpecial(%q) = %q; Encode gave %q", c.t.Model, c.t.Pre, s, texts(c.t, special), texts(c.t, ids))
		}
	}
}

// spellsSpecial reports whether s holds the text of a token that
// EncodeSpecial looks for and Encode does not.
func spellsSpecial(c *TokenCodec, s string) bool {
	if c.special == nil {
		return false
	}
	for _, tok := range c.special.text {
		if c.user != nil {
			if _, found := slices.BinarySearch(c.user.text, tok); found {
				continue
			}
		}
		if strings.Contains(s, tok) {
			return true
		}
	}
	return false
}

// stripReference is what Decode(Encode(s)) gives for a codec whose
// user-defined tokens strip whitespace (a byte-level one, without NFC),
// found the other way round: s is cut at its user-defined tokens as if
// none stripped, then each stretch of text loses its ASCII whitespace
// next to a token that strips on that side. The two agree where no
// user-defined token starts or ends with whitespace.
func stripReference(c *TokenCodec, s string) string {
	plain := *c.user
	plain.strip = nil
	type piece struct {
		text string
		id   int // -1: text
	}
	var pieces []piece
	plain.cut(s, func(raw string) error {
		pieces = append(pieces, piece{raw, -1})
		return nil
	}, func(id int) { pieces = append(pieces, piece{c.t.Tokens[id], id}) })
	strips := func(id int, side []int) bool { return id >= 0 && slices.Contains(side, id) }
	var b strings.Builder
	for i, p := range pieces {
		if p.id < 0 {
			if i > 0 && strips(pieces[i-1].id, c.t.RStrip) {
				p.text = strings.TrimLeft(p.text, " \t\n\v\f\r")
			}
			if i+1 < len(pieces) && strips(pieces[i+1].id, c.t.LStrip) {
				p.text = strings.TrimRight(p.text, " \t\n\v\f\r")
			}
		}
		b.WriteString(p.text)
	}
	return b.String()
}

// nfcBetweenUserTokens is what Decode(Encode(s)) gives: s, with the text
// between user-defined tokens in NFC where the codec normalizes.
func nfcBetweenUserTokens(c *TokenCodec, s string) string {
	if !c.nfc {
		return s
	}
	if c.user == nil {
		return norm.NFC.String(s)
	}
	var b strings.Builder
	c.user.cut(s, func(raw string) error {
		b.WriteString(norm.NFC.String(raw))
		return nil
	}, func(id int) { b.WriteString(c.t.Tokens[id]) })
	return b.String()
}

// TestTokenizeNFC: Qwen2's pre-tokenizer normalizes text to NFC first (a
// decomposed "é" encodes as the composed one), except the user-defined
// tokens, which are found in the raw text; GPT-2's does not normalize.
func TestTokenizeNFC(t *testing.T) {
	tk := withUserDefined(gpt2Vocab("Ã ©"), "e\u0301!")
	for pre, want := range map[string][]string{
		// Token texts are GPT-2's mapped bytes: é is C3 A9 ("Ã©"), the
		// combining acute CC 81 ("Ìģ").
		"qwen2": {"Ã©", "Ã©", "e\u0301!", "Ã©"},
		"gpt2":  {"Ã©", "e", "Ì", "ģ", "e\u0301!", "e", "Ì", "ģ"},
	} {
		tk.Pre = pre
		ids, err := newCodec(t, tk).Encode("ée\u0301e\u0301!e\u0301")
		if err != nil || !slices.Equal(texts(tk, ids), want) {
			t.Errorf("%s: Encode = %q, %v; want %q", pre, texts(tk, ids), err, want)
		}
	}
}

func TestTokenizeSpecialTokens(t *testing.T) {
	yes, no := true, false
	id := func(i int) *int { return &i }
	spm := func() *Tokenizer { return spmVocab([]string{"▁", "a"}, []float32{0, 0}, nil) }
	bpe := func(pre string) *Tokenizer { tk := gpt2Vocab(); tk.Pre = pre; return tk }
	for _, tc := range []struct {
		name string
		tk   *Tokenizer
		edit func(*Tokenizer)
		want []int // Encode("a")
	}{
		// llama.cpp's defaults: SentencePiece adds BOS, BPE only for Llama 3's names.
		{"spm default", spm(), nil, []int{1, 3, 4}},
		{"spm add_bos false", spm(), func(t *Tokenizer) { t.AddBOS = &no }, []int{3, 4}},
		{"spm add_eos", spm(), func(t *Tokenizer) { t.AddEOS = &yes }, []int{1, 3, 4, 2}},
		{"spm add_space_prefix false", spm(), func(t *Tokenizer) { t.AddSpacePrefix = &no }, []int{1, 4}},
		{"spm add_space_prefix true", spm(), func(t *Tokenizer) { t.AddSpacePrefix = &yes }, []int{1, 3, 4}},
		{"llama-bpe default", bpe("llama-bpe"), nil, []int{256, 'a'}},
		{"llama-bpe add_bos false", bpe("llama-bpe"), func(t *Tokenizer) { t.AddBOS = &no }, []int{'a'}},
		{"qwen2 default", bpe("qwen2"), nil, []int{'a'}},
		{"qwen2 add_bos", bpe("qwen2"), func(t *Tokenizer) { t.AddBOS = &yes }, []int{256, 'a'}},
		{"deepseek-v3 add_bos add_eos", bpe("deepseek-v3"), func(t *Tokenizer) { t.AddBOS, t.AddEOS = &yes, &yes }, []int{256, 'a', 256}},
		{"gpt2 add_eos false", bpe("gpt2"), func(t *Tokenizer) { t.AddEOS = &no }, []int{'a'}},
	} {
		if tc.edit != nil {
			tc.edit(tc.tk)
		}
		ids, err := newCodec(t, tc.tk).Encode("a")
		if err != nil || !slices.Equal(ids, tc.want) {
			t.Errorf("%s: Encode(\"a\") = %v, %v; want %v", tc.name, ids, err, tc.want)
		}
	}

	// The unknown token: the metadata's, even where a token of type
	// unknown comes first, and text does not become it.
	tk := spmVocab([]string{"▁", "a", "<oov>"}, []float32{0, 0, 0}, []byte{'a'})
	oov := len(tk.Tokens) - 2 // spmVocab puts the byte token last
	tk.UNK = id(oov)
	c := newCodec(t, tk)
	if ids, err := c.Encode("aü"); err != nil || !slices.Equal(texts(tk, ids), []string{"<s>", "▁", "a", "<oov>"}) {
		t.Errorf("unk from metadata: Encode(\"aü\") = %q, %v; want [<s> ▁ a <oov>]", texts(tk, ids), err)
	}
	// A one-character unknown token, bytes for every byte: its text
	// becomes it without the metadata, and its bytes with.
	tk2 := spmVocab([]string{"▁", "¿"}, []float32{0, 0}, nil)
	for _, tc := range []struct {
		unk  *int
		want []string
	}{{nil, []string{"<s>", "▁", "¿"}}, {id(4), []string{"<s>", "▁", "<0xC2>", "<0xBF>"}}} {
		tk2.UNK = tc.unk
		if ids, err := newCodec(t, tk2).Encode("¿"); err != nil || !slices.Equal(texts(tk2, ids), tc.want) {
			t.Errorf("unk %s: Encode(\"¿\") = %q, %v; want %q", opt(tc.unk), texts(tk2, ids), err, tc.want)
		}
	}
	tk.UNK = nil // guessed as before: the first token of type unknown
	if ids, _ := newCodec(t, tk).Encode("ü"); !slices.Equal(texts(tk, ids), []string{"<s>", "▁", "<unk>"}) {
		t.Errorf("unk guessed: Encode(\"ü\") = %q; want [<s> ▁ <unk>]", texts(tk, ids))
	}

	// Hostile ids and flags are refused.
	for _, tc := range []struct {
		field string
		edit  func(*Tokenizer)
	}{
		{"tokenizer.unk", func(t *Tokenizer) { t.UNK = id(len(t.Tokens)) }},
		{"tokenizer.unk", func(t *Tokenizer) { t.UNK = id(-1) }},
		{"tokenizer.pad", func(t *Tokenizer) { t.PAD = id(1 << 40) }},
		{"tokenizer.pad", func(t *Tokenizer) { t.PAD = id(-2) }},
		{"tokenizer.add_bos", func(t *Tokenizer) { t.BOS, t.AddBOS = -1, &yes }},
		{"tokenizer.add_eos", func(t *Tokenizer) { t.EOS, t.AddEOS = -1, &yes }},
	} {
		tk := spm()
		tc.edit(tk)
		var fe *FieldError
		if _, err := NewTokenCodec(tk); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: NewTokenCodec: %v; want a FieldError for it", tc.field, err)
		}
	}
	// Flags set to false need no token.
	tk = spm()
	tk.BOS, tk.EOS, tk.AddBOS, tk.AddEOS = -1, -1, &no, &no
	if ids, err := newCodec(t, tk).Encode("a"); err != nil || !slices.Equal(ids, []int{3, 4}) {
		t.Errorf("no BOS, no EOS: Encode = %v, %v; want [3 4]", ids, err)
	}
}

// withUserDefined appends tokens of type user-defined to tk.
func withUserDefined(tk *Tokenizer, texts ...string) *Tokenizer {
	for _, s := range texts {
		tk.Tokens = append(tk.Tokens, s)
		tk.Types = append(tk.Types, tokenUserDefined)
		if tk.Scores != nil {
			tk.Scores = append(tk.Scores, 0)
		}
	}
	return tk
}

// TestTokenizeUserDefined: user-defined tokens are found in the text
// before the pre-tokenizer and the merges run (llama.cpp's
// tokenizer_st_partition): from each position the longest, the leftmost
// first; the text between them is encoded as usual.
func TestTokenizeUserDefined(t *testing.T) {
	// No merge reaches any of them: only the first pass can.
	tk := withUserDefined(gpt2Vocab("Ġ t"), "<think>", "</think>", "  ", "   ", "ab", "bcd", "é")
	c := newCodec(t, tk)
	checkEncode(t, c, tk, []encodeCase{
		{"<think>", []string{"<think>"}},
		{"a<think>b</think>c", []string{"a", "<think>", "b", "</think>", "c"}},
		// Cut short, or inside another token's text: bytes.
		{"<think", []string{"<", "t", "h", "i", "n", "k"}},
		{"<<think>>", []string{"<", "<think>", ">"}},
		// The longest at a position: three spaces, not two and one. The
		// text around is split as usual (" t" merges).
		{"x    t", []string{"x", "   ", "Ġt"}},
		// The leftmost first: ab, not bcd (llama.cpp, which takes the
		// longer tokens first anywhere, gives a bcd; Hugging Face ab c d).
		{"abcd", []string{"ab", "c", "d"}},
		// A user-defined token's text is its raw text, not GPT-2's
		// mapped bytes ("é" is the byte E9 in that mapping).
		{"é", []string{"é"}},
		// A control token's text stays text.
		{"<|endoftext|>", []string{"<", "|", "e", "n", "d", "o", "f", "t", "e", "x", "t", "|", ">"}},
	})
	// The byte E9 alone is its byte's token, not the user-defined "é"
	// that GPT-2's byte mapping spells alike.
	if ids, err := c.Encode("\xe9"); err != nil || !slices.Equal(ids, []int{0xE9}) {
		t.Errorf("Encode(\"\\xe9\") = %v, %v; want [233]", ids, err)
	}
	if got := c.Decode([]int{tk.BOS, 'a', len(tk.Tokens) - 7, len(tk.Tokens) - 1}); got != "a<think>é" {
		t.Errorf("Decode = %q; want \"a<think>é\"", got)
	}

	// SentencePiece: each stretch of text around a user-defined token
	// gets the "▁" prefix, as llama.cpp's tokenize gives it.
	spm := withUserDefined(spmVocab([]string{"▁", "a", "▁a"}, []float32{0, 0, 1}, nil), "<b>")
	if ids, err := newCodec(t, spm).Encode("a<b>a"); err != nil || !slices.Equal(texts(spm, ids), []string{"<s>", "▁a", "<b>", "▁a"}) {
		t.Errorf("spm: Encode(\"a<b>a\") = %q, %v; want [<s> ▁a <b> ▁a]", texts(spm, ids), err)
	}

	// Never from text, whatever their type: BOS, EOS and the unknown
	// token. A user-defined token too long to look for is reached
	// through merges only, and the warning says so.
	long := strings.Repeat("x", maxUserTokenBytes+1)
	tk = withUserDefined(gpt2Vocab(), "<bos>", "<eos>", "<unk>", long)
	n := len(tk.Tokens)
	unk := n - 2
	tk.BOS, tk.EOS, tk.UNK = n-4, n-3, &unk
	c = newCodec(t, tk)
	for _, s := range []string{"<bos>", "<eos>", "<unk>", long} {
		ids, err := c.Encode(s)
		if err != nil || len(ids) != len(s) {
			t.Errorf("Encode(%.10q) = %q, %v; want its bytes", s, texts(tk, ids), err)
		}
	}
	if w := c.Warning(); !strings.Contains(w, "longer than") {
		t.Errorf("Warning() = %q; want it to name the user-defined token too long to match", w)
	}
}

// TestTokenizeUserDefinedHostile: the first pass reads at most
// maxUserTokenBytes of the text per position, and a prompt at the limit
// stays within it.
func TestTokenizeUserDefinedHostile(t *testing.T) {
	// At every position the walk reads maxUserTokenBytes-1 bytes before
	// it fails, and "a" matches.
	tk := withUserDefined(gpt2Vocab(), "a", strings.Repeat("a", maxUserTokenBytes-1)+"b", strings.Repeat("a", maxUserTokenBytes-1)+"c")
	c := newCodec(t, tk)
	long := strings.Repeat("a", MaxPromptBytes)
	ids, err := c.Encode(long)
	if err != nil || len(ids) != MaxPromptBytes || c.Decode(ids) != long {
		t.Errorf("a prompt at the limit: %d tokens, %v", len(ids), err)
	}
}

// TestTokenizeIgnoreMerges: for Llama 3's names, a piece that is a token
// is that token, as llama.cpp does (ignore_merges); other names run the
// merges.
func TestTokenizeIgnoreMerges(t *testing.T) {
	tk := gpt2Vocab("a b") // no merge reaches abc
	tk.Tokens = append(tk.Tokens, "abc")
	tk.Types = append(tk.Types, 1)
	for pre, want := range map[string][]string{
		"llama-bpe": {"<|endoftext|>", "abc"},
		"qwen2":     {"ab", "c"},
	} {
		tk.Pre = pre
		if ids, err := newCodec(t, tk).Encode("abc"); err != nil || !slices.Equal(texts(tk, ids), want) {
			t.Errorf("%s: Encode(\"abc\") = %q, %v; want %q", pre, texts(tk, ids), err, want)
		}
	}
}

// TestTokenizeManifestFields: the tokenizer's optional fields decode from
// a manifest, a manifest without them (older) still loads, and bad ones
// are refused naming the field.
func TestTokenizeManifestFields(t *testing.T) {
	b, err := os.ReadFile("testdata/example-manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	with := func(tok string) []byte {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		m["tokenizer"] = json.RawMessage(tok)
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	const base = `"model": "gpt2", "pre": "qwen2", "tokens": ["a", "b", "<|end|>"], "bos": 2, "eos": 2`
	old, err := Decode(with(`{` + base + `}`))
	if err != nil {
		t.Fatalf("a manifest without the new fields: %v", err)
	}
	if tk := old.Tokenizer; tk.AddBOS != nil || tk.AddEOS != nil || tk.UNK != nil || tk.PAD != nil || tk.AddSpacePrefix != nil || tk.LStrip != nil || tk.RStrip != nil {
		t.Errorf("absent fields decoded as add_bos %s, add_eos %s, unk %s, pad %s; want all absent", opt(tk.AddBOS), opt(tk.AddEOS), opt(tk.UNK), opt(tk.PAD))
	}
	m, err := Decode(with(`{` + base + `, "add_bos": false, "add_eos": true, "unk": 0, "pad": 1, "add_space_prefix": false, "lstrip": [2], "rstrip": [0, 2]}`))
	if err != nil {
		t.Fatal(err)
	}
	if tk := m.Tokenizer; tk.AddBOS == nil || *tk.AddBOS || tk.AddEOS == nil || !*tk.AddEOS || tk.UNK == nil || *tk.UNK != 0 || tk.PAD == nil || *tk.PAD != 1 || tk.AddSpacePrefix == nil || *tk.AddSpacePrefix {
		t.Errorf("decoded add_bos %s, add_eos %s, unk %s, pad %s; want false, true, 0, 1", opt(tk.AddBOS), opt(tk.AddEOS), opt(tk.UNK), opt(tk.PAD))
	}
	if tk := m.Tokenizer; !slices.Equal(tk.LStrip, []int{2}) || !slices.Equal(tk.RStrip, []int{0, 2}) {
		t.Errorf("decoded lstrip %v, rstrip %v; want [2], [0 2]", tk.LStrip, tk.RStrip)
	}
	// Encode writes them back (unk 0 is not left out).
	out, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if again, err := Decode(out); err != nil || again.Tokenizer.UNK == nil || *again.Tokenizer.UNK != 0 || again.Tokenizer.AddBOS == nil || *again.Tokenizer.AddBOS ||
		again.Tokenizer.AddSpacePrefix == nil || *again.Tokenizer.AddSpacePrefix || !slices.Equal(again.Tokenizer.RStrip, []int{0, 2}) {
		t.Errorf("round trip: %v; want unk 0, add_bos false, add_space_prefix false, rstrip [0 2]", err)
	}
	for _, tc := range []struct{ field, extra string }{
		{"tokenizer.unk", `, "unk": 3`},
		{"tokenizer.pad", `, "pad": -1`},
		{"tokenizer.add_bos", `, "bos": -1, "add_bos": true`},
		// Strip lists: ascending ids of the vocabulary, each once.
		{"tokenizer.lstrip", `, "lstrip": [3]`},
		{"tokenizer.lstrip", `, "lstrip": [-1]`},
		{"tokenizer.rstrip", `, "rstrip": [2, 1]`},
		{"tokenizer.rstrip", `, "rstrip": [1, 1]`},
		{"tokenizer.rstrip", `, "rstrip": [0, 4294967296]`},
	} {
		field, extra := tc.field, tc.extra
		tok := `{` + base + extra + `}`
		if field == "tokenizer.add_bos" {
			tok = strings.Replace(tok, `"bos": 2, `, "", 1)
		}
		var fe *FieldError
		if _, err := Decode(with(tok)); !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: Decode: %v; want a FieldError for it", tok, err)
		}
	}
}

// opt prints an optional field: its value, or "absent".
func opt[T any](p *T) string {
	if p == nil {
		return "absent"
	}
	return fmt.Sprint(*p)
}

// withTyped appends tokens of type typ to tk and returns their ids.
func withTyped(tk *Tokenizer, typ int32, texts ...string) []int {
	var ids []int
	for _, s := range texts {
		ids = append(ids, len(tk.Tokens))
		tk.Tokens = append(tk.Tokens, s)
		tk.Types = append(tk.Types, typ)
		if tk.Scores != nil {
			tk.Scores = append(tk.Scores, 0)
		}
	}
	return ids
}

// phi3Vocab is a toy vocabulary shaped like Phi-3's: SentencePiece,
// <unk> (unknown), <s> (control, BOS), </s> (user-defined, as Phi-3's
// GGUF types it), pieces that merge into "▁Hello", all byte tokens, then
// the chat's control tokens, <|endoftext|> the EOS. rstrip is what
// llama.cpp's phi-3 rule (gguf.Tokenizer's RStrip) gives it: every
// token of type unknown, control or user-defined, and </s>, except
// <unk>, <s> and <|endoftext|>.
func phi3Vocab() (tk *Tokenizer, rstrip []int) {
	// Merges, highest score first: He and ll (1, He leftmost), llo (2),
	// Hello (3), ▁Hello (4).
	tk = spmVocab([]string{"▁", "H", "e", "l", "o", "ll", "He", "llo", "Hello", "▁Hello"},
		[]float32{0, 0, 0, 0, 0, 1, 1, 2, 3, 4}, nil)
	tk.Types[2] = tokenUserDefined // </s>
	ctl := withTyped(tk, tokenControl, "<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>")
	tk.EOS = ctl[0]
	return tk, append([]int{2}, ctl[1:]...)
}

// TestTokenizeStrip: a token that strips the whitespace next to it
// (llama.cpp's LSTRIP and RSTRIP attributes) takes the ASCII whitespace
// on that side out of the neighbouring text, wherever the first pass
// finds it (Encode: user-defined tokens; EncodeSpecial: control and
// unknown ones too). Each want is derived from llama.cpp's
// tokenizer_st_partition by hand: the text is cut at the special tokens
// it finds; next to a token with RSTRIP (LSTRIP) the raw fragment on its
// right (left) loses its leading (trailing) isspace bytes, and a fragment
// left empty is dropped; then each raw fragment is encoded alone (for
// SentencePiece with " " in front, as every fragment after a token or at
// the start gets). noRule is the same vocabulary without the attributes,
// as a model that llama.cpp gives none: nothing is stripped.
func TestTokenizeStrip(t *testing.T) {
	phi3, rstrip := phi3Vocab()
	// The rule as gguf.Tokenizer applies it to a file named Phi3 (as
	// llama.cpp's ggml-vocab-phi-3.gguf is) gives the list above.
	var buf bytes.Buffer
	err := gguf.Write(&buf, []gguf.KV{
		{Key: "general.name", Value: "Phi3"},
		{Key: "tokenizer.ggml.model", Value: "llama"},
		{Key: "tokenizer.ggml.tokens", Value: gguf.Array{Type: gguf.TypeString, Values: phi3.Tokens}},
		{Key: "tokenizer.ggml.token_type", Value: gguf.Array{Type: gguf.TypeInt32, Values: phi3.Types}},
	}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if g, err := f.Tokenizer(); err != nil || g.LStrip != nil || !slices.Equal(g.RStrip, rstrip) {
		t.Fatalf("gguf.Tokenizer of a Phi3 file: %v; want rstrip %v", err, rstrip)
	}
	phi3Rule := *phi3
	phi3Rule.RStrip = rstrip
	// A Jina-v2-like byte-level vocabulary: <mask> (control) strips on
	// its left (llama.cpp's rule for jina-v2-de, -es, -code).
	jina := gpt2Vocab("Ġ b")
	mask := withTyped(jina, tokenControl, "<mask>")
	jinaRule := *jina
	jinaRule.LStrip = mask

	for _, tc := range []struct {
		name         string
		tk, rule     *Tokenizer
		special      bool // EncodeSpecial, else Encode
		in           string
		want, noRule []string
	}{
		{
			// Fragments: <|user|>, "\n Hello", <|end|>, "\n". RSTRIP drops
			// "\n " and all of the last "\n"; " Hello" is ▁Hello. Without
			// the rule: " \n Hello" is ▁ <0x0A> ▁Hello, " \n" ▁ <0x0A>.
			name: "phi-3 chat turn", tk: phi3, rule: &phi3Rule, special: true,
			in:     "<|user|>\n Hello<|end|>\n",
			want:   []string{"<s>", "<|user|>", "▁Hello", "<|end|>"},
			noRule: []string{"<s>", "<|user|>", "▁", "<0x0A>", "▁Hello", "<|end|>", "▁", "<0x0A>"},
		},
		{
			// Whitespace between two stripping tokens vanishes; " \nHello"
			// without the rule is ▁ <0x0A> Hello ("\nH" is no token).
			name: "phi-3 two turns", tk: phi3, rule: &phi3Rule, special: true,
			in:     "<|user|>\nHello<|end|>\n<|assistant|>",
			want:   []string{"<s>", "<|user|>", "▁Hello", "<|end|>", "<|assistant|>"},
			noRule: []string{"<s>", "<|user|>", "▁", "<0x0A>", "Hello", "<|end|>", "▁", "<0x0A>", "<|assistant|>"},
		},
		{
			// RSTRIP leaves the left side: " Hello " is ▁Hello ▁.
			name: "phi-3 left kept", tk: phi3, rule: &phi3Rule, special: true,
			in:     "Hello <|end|>",
			want:   []string{"<s>", "▁Hello", "▁", "<|end|>"},
			noRule: []string{"<s>", "▁Hello", "▁", "<|end|>"},
		},
		{
			// isspace's six bytes go; U+00A0 is not one of them: " \u00a0Hello"
			// is ▁, its two bytes, Hello.
			name: "phi-3 C whitespace", tk: phi3, rule: &phi3Rule, special: true,
			in:     "<|end|>\t\r\v\f \u00a0Hello",
			want:   []string{"<s>", "<|end|>", "▁", "<0xC2>", "<0xA0>", "Hello"},
			noRule: []string{"<s>", "<|end|>", "▁", "<0x09>", "<0x0D>", "<0x0B>", "<0x0C>", "▁", "<0xC2>", "<0xA0>", "Hello"},
		},
		{
			// <|endoftext|> is one of the rule's exceptions: "  Hello" is
			// ▁ ▁Hello either way.
			name: "phi-3 endoftext", tk: phi3, rule: &phi3Rule, special: true,
			in:     "<|endoftext|> Hello",
			want:   []string{"<s>", "<|endoftext|>", "▁", "▁Hello"},
			noRule: []string{"<s>", "<|endoftext|>", "▁", "▁Hello"},
		},
		{
			// </s> is user-defined (and not the EOS): Encode finds it, and
			// its RSTRIP applies without parse special too.
			name: "phi-3 </s> in Encode", tk: phi3, rule: &phi3Rule,
			in:     "Hello</s>\n Hello",
			want:   []string{"<s>", "▁Hello", "</s>", "▁Hello"},
			noRule: []string{"<s>", "▁Hello", "</s>", "▁", "<0x0A>", "▁Hello"},
		},
		{
			// LSTRIP: "a " loses its space; " b" is Ġb.
			name: "jina <mask>", tk: jina, rule: &jinaRule, special: true,
			in:     "a <mask> b",
			want:   []string{"a", "<mask>", "Ġb"},
			noRule: []string{"a", "Ġ", "<mask>", "Ġb"},
		},
		{
			// A fragment of whitespace only vanishes.
			name: "jina <mask> after newlines", tk: jina, rule: &jinaRule, special: true,
			in:     "\n\n<mask>",
			want:   []string{"<mask>"},
			noRule: []string{"Ċ", "Ċ", "<mask>"},
		},
	} {
		for _, v := range []struct {
			tk   *Tokenizer
			want []string
		}{{tc.rule, tc.want}, {tc.tk, tc.noRule}} {
			c := newCodec(t, v.tk)
			enc, how := c.Encode, "Encode"
			if tc.special {
				enc, how = c.EncodeSpecial, "EncodeSpecial"
			}
			ids, err := enc(tc.in)
			if got := texts(v.tk, ids); err != nil || !slices.Equal(got, v.want) {
				t.Errorf("%s, strip %v/%v: %s(%q) = %q, %v; want %q", tc.name, v.tk.LStrip, v.tk.RStrip, how, tc.in, got, err, v.want)
			}
		}
	}

	// Without parse special the control tokens stay text, so nothing
	// strips next to them: Encode never yields <|user|> or <|end|>.
	c := newCodec(t, &phi3Rule)
	ids, err := c.Encode("<|user|>\n Hello<|end|>\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if phi3.Types[id] == tokenControl && id != phi3.BOS {
			t.Errorf("Encode gave the control token %q", phi3.Tokens[id])
		}
	}
	if got, want := c.Decode(ids), "<|user|>\n Hello<|end|>\n"; got != want {
		t.Errorf("Decode(Encode(chat)) = %q; want %q", got, want)
	}
}
