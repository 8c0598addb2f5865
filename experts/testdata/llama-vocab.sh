#!/bin/sh
# llama-vocab.sh GIT-DIR OUT-DIR [REV]
#
# Copies llama.cpp's tokenizer-only vocabularies and their test vectors
# (models/ggml-vocab-NAME.gguf, .gguf.inp, .gguf.out) out of a llama.cpp
# git directory (bare or not) at REV (default HEAD) into OUT-DIR, for
# TestLlamaVocab:
#
#   RDRR_LLAMA_VOCAB_DIR=OUT-DIR go test ./experts -run TestLlamaVocab -v
#
# Files that git stores as Git LFS pointers, or whose blobs the copy of
# the repository lacks, are left out and listed. Nothing here belongs in
# this repository: the files are llama.cpp's (MIT) and are not committed.
set -eu
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
	echo "usage: $0 GIT-DIR OUT-DIR [REV]" >&2
	exit 2
fi
git_dir=$1 out=$2 rev=${3:-HEAD}
mkdir -p "$out"
git --git-dir="$git_dir" ls-tree "$rev" models/ | while read -r _mode type blob path; do
	name=${path#models/}
	case $name in
	ggml-vocab-*.gguf | ggml-vocab-*.gguf.inp | ggml-vocab-*.gguf.out) ;;
	*) continue ;;
	esac
	[ "$type" = blob ] || continue
	if ! git --git-dir="$git_dir" cat-file -e "$blob" 2>/dev/null; then
		echo "absent: $name" >&2
		continue
	fi
	if git --git-dir="$git_dir" cat-file blob "$blob" | head -c 40 | grep -q '^version https://git-lfs'; then
		echo "git lfs pointer: $name" >&2
		continue
	fi
	git --git-dir="$git_dir" cat-file blob "$blob" >"$out/$name"
done
ls "$out"
