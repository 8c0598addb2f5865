package gguf

import "fmt"

// TensorType is a ggml_type.
type TensorType uint32

// The ggml types (ggml.h, enum ggml_type). Ids 4, 5 and 31 to 38 were
// removed from GGML and are not valid in a file.
const (
	F32     TensorType = 0
	F16     TensorType = 1
	Q4_0    TensorType = 2
	Q4_1    TensorType = 3
	Q5_0    TensorType = 6
	Q5_1    TensorType = 7
	Q8_0    TensorType = 8
	Q8_1    TensorType = 9
	Q2_K    TensorType = 10
	Q3_K    TensorType = 11
	Q4_K    TensorType = 12
	Q5_K    TensorType = 13
	Q6_K    TensorType = 14
	Q8_K    TensorType = 15
	IQ2_XXS TensorType = 16
	IQ2_XS  TensorType = 17
	IQ3_XXS TensorType = 18
	IQ1_S   TensorType = 19
	IQ4_NL  TensorType = 20
	IQ3_S   TensorType = 21
	IQ2_S   TensorType = 22
	IQ4_XS  TensorType = 23
	I8      TensorType = 24
	I16     TensorType = 25
	I32     TensorType = 26
	I64     TensorType = 27
	F64     TensorType = 28
	IQ1_M   TensorType = 29
	BF16    TensorType = 30
	TQ1_0   TensorType = 34
	TQ2_0   TensorType = 35
	MXFP4   TensorType = 39
	NVFP4   TensorType = 40
	Q1_0    TensorType = 41
	Q2_0    TensorType = 42
)

// typeInfo is a type's name and block: weights per block and bytes per
// block (ggml.c's type_traits blck_size and type_size, the sizes printed
// by sizeof on ggml-common.h at ggml commit d99724f2).
type typeInfo struct {
	name          string
	block, blockB uint64
}

var typeInfos = map[TensorType]typeInfo{
	F32: {"F32", 1, 4}, F16: {"F16", 1, 2}, BF16: {"BF16", 1, 2}, F64: {"F64", 1, 8},
	I8: {"I8", 1, 1}, I16: {"I16", 1, 2}, I32: {"I32", 1, 4}, I64: {"I64", 1, 8},
	Q4_0: {"Q4_0", 32, 18}, Q4_1: {"Q4_1", 32, 20}, Q5_0: {"Q5_0", 32, 22}, Q5_1: {"Q5_1", 32, 24},
	Q8_0: {"Q8_0", 32, 34}, Q8_1: {"Q8_1", 32, 36},
	Q2_K: {"Q2_K", 256, 84}, Q3_K: {"Q3_K", 256, 110}, Q4_K: {"Q4_K", 256, 144}, Q5_K: {"Q5_K", 256, 176},
	Q6_K: {"Q6_K", 256, 210}, Q8_K: {"Q8_K", 256, 292},
	IQ2_XXS: {"IQ2_XXS", 256, 66}, IQ2_XS: {"IQ2_XS", 256, 74}, IQ3_XXS: {"IQ3_XXS", 256, 98},
	IQ1_S: {"IQ1_S", 256, 50}, IQ4_NL: {"IQ4_NL", 32, 18}, IQ3_S: {"IQ3_S", 256, 110},
	IQ2_S: {"IQ2_S", 256, 82}, IQ4_XS: {"IQ4_XS", 256, 136}, IQ1_M: {"IQ1_M", 256, 56},
	TQ1_0: {"TQ1_0", 256, 54}, TQ2_0: {"TQ2_0", 256, 66},
	MXFP4: {"MXFP4", 32, 17}, NVFP4: {"NVFP4", 64, 36}, Q1_0: {"Q1_0", 128, 18}, Q2_0: {"Q2_0", 64, 18},
}

func (t TensorType) String() string {
	if ti, ok := typeInfos[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("ggml_type(%d)", uint32(t))
}

// Known reports whether t is a ggml type this package can size.
func (t TensorType) Known() bool { _, ok := typeInfos[t]; return ok }

// Supported reports whether t is one of the types the converter reads:
// F32, F16, BF16 and Q4_K. Other known types are read (their data is
// located and bounded) but cannot be converted.
func (t TensorType) Supported() bool {
	return t == F32 || t == F16 || t == BF16 || t == Q4_K
}

// Block returns the weights per block and the bytes per block of a known
// type (1 weight for the plain types).
func (t TensorType) Block() (weights, bytes uint64, ok bool) {
	ti, ok := typeInfos[t]
	return ti.block, ti.blockB, ok
}

// DataSize returns the bytes of n elements whose innermost dimension is
// ne0 (a multiple of the type's block), for any known type. n must be at
// most 2^50 (Read bounds it so).
func (t TensorType) DataSize(n, ne0 uint64) (uint64, error) {
	ti, ok := typeInfos[t]
	if !ok {
		return 0, fmt.Errorf("unknown tensor type %d", uint32(t))
	}
	if ne0%ti.block != 0 {
		return 0, fmt.Errorf("%s rows of %d weights (want a multiple of %d)", t, ne0, ti.block)
	}
	return n / ti.block * ti.blockB, nil
}
