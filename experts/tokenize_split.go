package experts

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Pre-tokenizer splits: a byte-level BPE model first cuts its text into
// pieces with a regular expression, and merges stay within a piece. The
// patterns are those llama.cpp runs for each tokenizer.ggml.pre
// (src/llama-vocab.cpp, llm_tokenizer_bpe), written out by hand because
// Go's regexp has no lookahead (\s+(?!\S)). One scanner serves them all:
// a pattern is a function that returns the end of the piece its
// alternatives match at a position, tried in the pattern's order.
// testdata/presplit.json holds the pieces Python's regex module cuts with
// the same patterns, and the tests compare.

// preTokenizer is what a tokenizer.ggml.pre name selects.
type preTokenizer struct {
	split func(text string, yield func(string) bool)
	// llama.cpp's defaults for the name: BOS prepended unless the model
	// says otherwise (tokenizer.ggml.add_bos_token), and a piece that is a
	// token taken whole without running the merges.
	addBOS, ignoreMerges bool
	// nfc: the model's own tokenizer normalizes text to Unicode NFC
	// before the split (Hugging Face's normalizer; llama.cpp does not).
	nfc bool
}

// preTokenizers maps the tokenizer.ggml.pre names llama.cpp gives each of
// these splits (aliases included) to it. A name not here is split as
// GPT-2 splits, with a warning (TokenCodec.Warning).
var preTokenizers = map[string]preTokenizer{
	"gpt2":         {split: splitGPT2},
	"gpt-2":        {split: splitGPT2},
	"mpt":          {split: splitGPT2},
	"olmo":         {split: splitGPT2},
	"jais":         {split: splitGPT2},
	"phi-2":        {split: splitGPT2},
	"roberta-bpe":  {split: splitGPT2},
	"gigachat":     {split: splitGPT2},
	"jina-es":      {split: splitGPT2},
	"jina-de":      {split: splitGPT2},
	"jina-v1-en":   {split: splitGPT2},
	"jina-v2-es":   {split: splitGPT2},
	"jina-v2-de":   {split: splitGPT2},
	"jina-v2-code": {split: splitGPT2},

	"starcoder":  {split: splitStarCoder},
	"refact":     {split: splitStarCoder},
	"command-r":  {split: splitStarCoder},
	"smollm":     {split: splitStarCoder},
	"codeshell":  {split: splitStarCoder},
	"exaone":     {split: splitStarCoder},
	"minerva-7b": {split: splitStarCoder},

	"falcon": {split: splitFalcon},

	"llama-bpe": {split: splitLlama3, addBOS: true, ignoreMerges: true},
	"llama3":    {split: splitLlama3, addBOS: true, ignoreMerges: true},
	"llama-v3":  {split: splitLlama3, addBOS: true, ignoreMerges: true},
	"falcon3":   {split: splitLlama3, addBOS: true, ignoreMerges: true},
	"dbrx":      {split: splitLlama3},
	"smaug-bpe": {split: splitLlama3},

	// Qwen2's tokenizer.json (and the DeepSeek-R1 distillations' made
	// from Qwen2.5's) has an NFC normalizer; of the others checked, Llama
	// 3's and DeepSeek-V3's have none.
	"qwen2":            {split: splitQwen2, nfc: true},
	"deepseek-r1-qwen": {split: splitQwen2, nfc: true},
	"stablelm2":        {split: splitQwen2},
	"megrez":           {split: splitQwen2},

	"deepseek-llm":   {split: splitDeepSeekLLM},
	"deepseek-coder": {split: splitDeepSeekCoder},

	"deepseek-v3":   {split: splitDeepSeek3},
	"hunyuan-dense": {split: splitDeepSeek3},
	"joyai-llm":     {split: splitDeepSeek3},
}

// lookupPre returns the pre-tokenizer called name, or GPT-2's and a
// warning that says the split is an approximation.
func lookupPre(name string) (preTokenizer, string) {
	if p, ok := preTokenizers[name]; ok {
		return p, ""
	}
	if name == "" {
		return preTokenizer{split: splitGPT2}, "tokenizer: the model names no pre-tokenizer (tokenizer.ggml.pre); splitting the text as GPT-2 does, so prompts may get other tokens than the model's own tokenizer gives"
	}
	return preTokenizer{split: splitGPT2}, fmt.Sprintf("tokenizer: pre-tokenizer %q is not known here; splitting the text as GPT-2 does, so prompts may get other tokens than the model's own tokenizer gives", name)
}

// splitGPT2 cuts text as GPT-2's pattern does:
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func splitGPT2(text string, yield func(string) bool) {
	splitSpan(span{text, len(text)}, 0, gpt2Piece, yield)
}

// splitStarCoder cuts text as StarCoder's pre-tokenizer (llama.cpp's
// starcoder, refact, command-r and others) does: each \p{N} character a
// piece, then GPT-2's pattern over every piece.
var splitStarCoder = cascade(isolated(oneNumber), isolated(gpt2Piece))

// splitFalcon cuts text as Falcon's pre-tokenizer does, three patterns in
// turn:
//
//	[\p{P}\$\+<=>\^~\|`]+
//	GPT-2's
//	[0-9][0-9][0-9]
var splitFalcon = cascade(isolated(falconPunct), isolated(gpt2Piece), isolated(threeASCIIDigits))

// splitDeepSeekLLM cuts text as DeepSeek-LLM's pre-tokenizer (also
// DeepSeek-V2's and Coder-V2's) does, six patterns in turn:
//
//	[\r\n]
//	\s?[A-Za-zµÀ-ÖØ-öø-ƺ...]+   (deepseekLLMLetters)
//	\s?[!-/:-~！-／：-～‘-‟　-。]+
//	\s+$
//	[一-龥ࠀ-一가-퟿]+
//	\p{N}+
var splitDeepSeekLLM = cascade(isolated(newline),
	isolated(func(p span, i int) int { return p.lead(i, isSpace, deepseekLLMLetters.has, false) }),
	isolated(func(p span, i int) int { return p.lead(i, isSpace, deepseekLLMPunct.has, false) }),
	trailingSpaces,
	isolated(func(p span, i int) int { return p.runOf(i, deepseekCJK.has) }),
	isolated(func(p span, i int) int { return p.runOf(i, isNumber) }))

// splitDeepSeekCoder cuts text as DeepSeek-Coder's pre-tokenizer does,
// five patterns in turn:
//
//	[\r\n]
//	\s?\p{L}+
//	\s?\p{P}+
//	[一-龥ࠀ-一가-퟿]+
//	\p{N}
var splitDeepSeekCoder = cascade(isolated(newline),
	isolated(func(p span, i int) int { return p.lead(i, isSpace, isLetter, false) }),
	isolated(func(p span, i int) int { return p.lead(i, isSpace, isPunct, false) }),
	isolated(func(p span, i int) int { return p.runOf(i, deepseekCJK.has) }),
	isolated(oneNumber))

// cascade returns the split that cuts text with each stage in turn, each
// cutting every piece of the one before.
func cascade(stages ...func(text string, yield func(string) bool) bool) func(string, func(string) bool) {
	var run func(k int, text string, yield func(string) bool) bool
	run = func(k int, text string, yield func(string) bool) bool {
		if k == len(stages) {
			return yield(text)
		}
		return stages[k](text, func(piece string) bool { return run(k+1, piece, yield) })
	}
	return func(text string, yield func(string) bool) { run(0, text, yield) }
}

// isolated is the stage that cuts text with piece's matches: matches and
// the text between them both become pieces (Hugging Face's "Isolated"
// split).
func isolated(piece func(p span, i int) int) func(string, func(string) bool) bool {
	return func(text string, yield func(string) bool) bool {
		return splitSpan(span{text, len(text)}, 0, piece, yield)
	}
}

// trailingSpaces is the stage \s+$: the whitespace that ends text is a
// piece of its own. (Written out, as a match tried at each position would
// scan every run of spaces to its end: quadratic.)
func trailingSpaces(text string, yield func(string) bool) bool {
	k := len(text)
	for k > 0 {
		r, n := utf8.DecodeLastRuneInString(text[:k])
		if runeClass(r) != classSpace {
			break
		}
		k -= n
	}
	if k > 0 && !yield(text[:k]) {
		return false
	}
	return k == len(text) || yield(text[k:])
}

// oneNumber matches \p{N}: one number character.
func oneNumber(p span, i int) int {
	if _, n, c := p.at(i); c == classNumber {
		return i + n
	}
	return -1
}

// newline matches [\r\n]: one of them.
func newline(p span, i int) int {
	if r, n, _ := p.at(i); r == '\r' || r == '\n' {
		return i + n
	}
	return -1
}

// threeASCIIDigits matches [0-9][0-9][0-9].
func threeASCIIDigits(p span, i int) int {
	if i+3 > p.end {
		return -1
	}
	for _, b := range []byte(p.s[i : i+3]) {
		if b < '0' || b > '9' {
			return -1
		}
	}
	return i + 3
}

// falconPunct matches [\p{P}\$\+<=>\^~\|`]+.
func falconPunct(p span, i int) int {
	return p.runOf(i, func(r rune, c charClass) bool {
		return c == classPunct || strings.ContainsRune("$+<=>^~|`", r)
	})
}

// runOf matches in+ at i, or returns -1.
func (p span) runOf(i int, in charSet) int {
	if j := p.run(i, in); j > i {
		return j
	}
	return -1
}

// runeRanges is a regex character class as ranges: sorted, disjoint.
type runeRanges []struct{ lo, hi rune }

// parseRuneRanges reads the inside of a character class of single
// characters and ranges (a-z), as llama.cpp's patterns write them: in
// any order, overlapping.
func parseRuneRanges(class string) runeRanges {
	rs := []rune(class)
	var in runeRanges
	for k := 0; k < len(rs); {
		lo, hi := rs[k], rs[k]
		k++
		if k+1 < len(rs) && rs[k] == '-' {
			hi = rs[k+1]
			k += 2
		}
		if lo > hi {
			panic("experts: bad range in character class " + class)
		}
		in = append(in, struct{ lo, hi rune }{lo, hi})
	}
	slices.SortFunc(in, func(a, b struct{ lo, hi rune }) int { return int(a.lo - b.lo) })
	var out runeRanges
	for _, r := range in {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

func (rr runeRanges) has(r rune, _ charClass) bool {
	k := sort.Search(len(rr), func(k int) bool { return rr[k].hi >= r })
	return k < len(rr) && rr[k].lo <= r
}

// The classes of DeepSeek-LLM's and DeepSeek-Coder's patterns, as
// llama.cpp (and the models' tokenizer.json) write them. The letters are
// Unicode's cased letters (Lu, Ll, Lt) of the version they were written
// with.
var (
	deepseekLLMLetters = parseRuneRanges("A-Za-z\u00b5À-ÖØ-öø-ƺƼ-ƿ\u01c4-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-\u03f5Ϸ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼ\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149ⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿ\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943")
	deepseekLLMPunct   = parseRuneRanges("!-/:-~\uff01-\uff0f\uff1a-\uff5e‘-‟\u3000-。")
	deepseekCJK        = parseRuneRanges("一-龥ࠀ-一가-\ud7ff")
)

// splitLlama3 cuts text as Llama 3's pattern (llama.cpp's llama-bpe) does:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// The contractions ignore ASCII case only, as llama.cpp's rewrite of the
// pattern ('[sS]...) does; Unicode case folding would also take "'ſ".
func splitLlama3(text string, yield func(string) bool) {
	splitSpan(span{text, len(text)}, 0, func(p span, i int) int { return llamaPiece(p, i, 3) }, yield)
}

// splitQwen2 cuts text as Qwen2's pattern does: Llama 3's with \p{N}, one
// digit a piece, for \p{N}{1,3}.
func splitQwen2(text string, yield func(string) bool) {
	splitSpan(span{text, len(text)}, 0, func(p span, i int) int { return llamaPiece(p, i, 1) }, yield)
}

// splitDeepSeek3 cuts text as DeepSeek-V3's pre-tokenizer does: three
// patterns in turn, each cutting the pieces of the one before (matches
// and the text between them both become pieces, HuggingFace's "Isolated"
// split):
//
//	\p{N}{1,3}
//	[一-龥぀-ゟ゠-ヿ]+
//	[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//	 ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// The first two never overlap (no CJK character of those ranges is a
// number), so one pass cuts runs of numbers (in threes), runs of those
// CJK characters and the runs between, and the third pattern cuts each
// run on its own: its lookahead stops at the run's end. Characters the
// third matches nowhere (a control character, say) stay together as one
// piece. "~" is a symbol here as in the pattern (llama.cpp's
// category-collapsed regex leaves it out of \p{S}).
func splitDeepSeek3(text string, yield func(string) bool) {
	whole := span{text, len(text)}
	for i := 0; i < len(text); {
		r, _, c := whole.at(i)
		var j int
		switch {
		case c == classNumber:
			j = whole.numbers(i, 3)
		case isDeepSeekCJK(r):
			j = whole.run(i, func(r rune, _ charClass) bool { return isDeepSeekCJK(r) })
		default:
			j = whole.run(i, func(r rune, c charClass) bool { return c != classNumber && !isDeepSeekCJK(r) })
		}
		if !splitSpan(span{text, j}, i, deepseekPiece, yield) {
			return
		}
		i = j
	}
}

// isDeepSeekCJK is [一-龥぀-ゟ゠-ヿ]: CJK ideographs U+4E00-U+9FA5,
// hiragana and katakana U+3040-U+30FF.
func isDeepSeekCJK(r rune) bool {
	return r >= 0x4E00 && r <= 0x9FA5 || r >= 0x3040 && r <= 0x30FF
}

// charClass is a character's Unicode class as the patterns see it.
// unicode.IsSpace is \s (Unicode's White_Space, as Python's regex
// module, the reference the tests use); the others are general
// categories.
type charClass uint8

const (
	classEnd    charClass = iota // past the end of the span
	classOther                   // controls, format characters, unassigned
	classLetter                  // \p{L}
	classMark                    // \p{M}
	classNumber                  // \p{N}
	classPunct                   // \p{P}
	classSymbol                  // \p{S}; an invalid UTF-8 byte too (llama.cpp reads it as U+FFFD, a symbol)
	classSpace                   // \s
)

func runeClass(r rune) charClass {
	switch {
	case r < utf8.RuneSelf:
		switch {
		case r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z':
			return classLetter
		case r >= '0' && r <= '9':
			return classNumber
		case r == ' ' || r >= '\t' && r <= '\r':
			return classSpace
		case r < ' ' || r == 0x7F:
			return classOther
		case r == '$' || r == '+' || r == '<' || r == '=' || r == '>' || r == '^' || r == '`' || r == '|' || r == '~':
			return classSymbol
		}
		return classPunct
	case unicode.IsLetter(r):
		return classLetter
	case unicode.IsMark(r):
		return classMark
	case unicode.IsNumber(r):
		return classNumber
	case unicode.IsPunct(r):
		return classPunct
	case unicode.IsSymbol(r): // utf8.RuneError, U+FFFD, too
		return classSymbol
	case unicode.IsSpace(r):
		return classSpace
	}
	return classOther
}

// span is the text a pattern runs over: s[:end]. The pattern sees
// nothing past end (a cascade's later patterns run within the pieces of
// the earlier ones).
type span struct {
	s   string
	end int
}

// at returns the character at i, its size and class; size 0 and classEnd
// at the end. An invalid byte is one character, utf8.RuneError.
func (p span) at(i int) (rune, int, charClass) {
	if i >= p.end {
		return -1, 0, classEnd
	}
	r, n := utf8.DecodeRuneInString(p.s[i:p.end])
	return r, n, runeClass(r)
}

// charSet is a set of characters (a regex character class).
type charSet func(r rune, c charClass) bool

func isLetter(_ rune, c charClass) bool      { return c == classLetter }
func isPunct(_ rune, c charClass) bool       { return c == classPunct }
func isSpace(_ rune, c charClass) bool       { return c == classSpace }
func isNumber(_ rune, c charClass) bool      { return c == classNumber }
func isLetterMark(_ rune, c charClass) bool  { return c == classLetter || c == classMark }
func isPunctSymbol(_ rune, c charClass) bool { return c == classPunct || c == classSymbol }
func isSpaceChar(r rune, _ charClass) bool   { return r == ' ' }
func isNewline(r rune, _ charClass) bool     { return r == '\r' || r == '\n' }

// notSpaceLetterNumber is [^\s\p{L}\p{N}].
func notSpaceLetterNumber(_ rune, c charClass) bool {
	return c != classEnd && c != classSpace && c != classLetter && c != classNumber
}

// notNewlineLetterNumber is [^\r\n\p{L}\p{N}].
func notNewlineLetterNumber(r rune, c charClass) bool {
	return c != classEnd && r != '\r' && r != '\n' && c != classLetter && c != classNumber
}

// notNewlineLetterPunctSymbol is [^\r\n\p{L}\p{P}\p{S}].
func notNewlineLetterPunctSymbol(r rune, c charClass) bool {
	return c != classEnd && r != '\r' && r != '\n' && c != classLetter && c != classPunct && c != classSymbol
}

// isASCIIPunct is [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~].
func isASCIIPunct(r rune, _ charClass) bool {
	return r > ' ' && r < 0x7F && !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
}

// isASCIILetter is [A-Za-z].
func isASCIILetter(r rune, _ charClass) bool { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' }

// run returns the end of the run of in's characters from i.
func (p span) run(i int, in charSet) int {
	for {
		r, n, c := p.at(i)
		if n == 0 || !in(r, c) {
			return i
		}
		i += n
	}
}

// lead matches first?body+ at i (first+body+ when must): one character
// of first, then a run of body's; without the first character if the run
// does not follow it, as a regex backtracks. It returns the match's end,
// -1 for none.
func (p span) lead(i int, first, body charSet, must bool) int {
	if r, n, c := p.at(i); n > 0 && first(r, c) {
		if j := p.run(i+n, body); j > i+n {
			return j
		}
	}
	if must {
		return -1
	}
	if j := p.run(i, body); j > i {
		return j
	}
	return -1
}

// contraction matches 's|'t|'re|'ve|'m|'ll|'d at i (any ASCII case with
// fold), or returns -1.
func (p span) contraction(i int, fold bool) int {
	s := p.s[i:p.end]
	if len(s) < 2 || s[0] != '\'' {
		return -1
	}
	lower := func(b byte) byte {
		if fold && b >= 'A' && b <= 'Z' {
			return b + 'a' - 'A'
		}
		return b
	}
	switch lower(s[1]) {
	case 's', 't', 'm', 'd':
		return i + 2
	}
	if len(s) >= 3 {
		switch string([]byte{lower(s[1]), lower(s[2])}) {
		case "re", "ve", "ll":
			return i + 3
		}
	}
	return -1
}

// numbers matches \p{N}{1,max} at i, or returns -1.
func (p span) numbers(i, max int) int {
	j := i
	for k := 0; k < max; k++ {
		_, n, c := p.at(j)
		if c != classNumber {
			break
		}
		j += n
	}
	if j == i {
		return -1
	}
	return j
}

// spaces matches, in this order, \s*[\r\n]+ (with newlines), \s+(?!\S)
// and \s+ at i, or returns -1. The lookahead leaves the last space of a
// run to the piece that follows, unless the run is one space or ends the
// span.
func (p span) spaces(i int, newlines bool) int {
	j, last, afterNewline := i, i, -1
	for {
		r, n, c := p.at(j)
		if c != classSpace {
			break
		}
		if r == '\r' || r == '\n' {
			afterNewline = j + n
		}
		last = j
		j += n
	}
	switch {
	case j == i:
		return -1
	case newlines && afterNewline > 0:
		return afterNewline
	case j < p.end && last > i:
		return last
	}
	return j
}

// gpt2Piece: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func gpt2Piece(p span, i int) int {
	if j := p.contraction(i, false); j > 0 {
		return j
	}
	for _, body := range [...]charSet{isLetter, isNumber, notSpaceLetterNumber} {
		if j := p.lead(i, isSpaceChar, body, false); j > 0 {
			return j
		}
	}
	return p.spaces(i, false)
}

// llamaPiece: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func llamaPiece(p span, i, digits int) int {
	if j := p.contraction(i, true); j > 0 {
		return j
	}
	if j := p.lead(i, notNewlineLetterNumber, isLetter, false); j > 0 {
		return j
	}
	if j := p.numbers(i, digits); j > 0 {
		return j
	}
	if j := p.lead(i, isSpaceChar, notSpaceLetterNumber, false); j > 0 {
		return p.run(j, isNewline)
	}
	return p.spaces(i, true)
}

// deepseekPiece is the third pattern of DeepSeek-V3's:
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
// ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func deepseekPiece(p span, i int) int {
	if j := p.lead(i, isASCIIPunct, isASCIILetter, true); j > 0 {
		return j
	}
	if j := p.lead(i, notNewlineLetterPunctSymbol, isLetterMark, false); j > 0 {
		return j
	}
	if j := p.lead(i, isSpaceChar, isPunctSymbol, false); j > 0 {
		return p.run(j, isNewline)
	}
	return p.spaces(i, true)
}

// splitSpan cuts p from i with piece (the end of the match at a
// position, -1 for none) and calls yield with each match and each run of
// characters between matches; it returns false once yield does.
func splitSpan(p span, i int, piece func(p span, i int) int, yield func(string) bool) bool {
	gap := i
	for i < p.end {
		j := piece(p, i)
		if j < 0 {
			_, n, _ := p.at(i)
			i += n
			continue
		}
		if gap < i && !yield(p.s[gap:i]) {
			return false
		}
		if !yield(p.s[i:j]) {
			return false
		}
		i, gap = j, j
	}
	if gap < p.end {
		return yield(p.s[gap:p.end])
	}
	return true
}
