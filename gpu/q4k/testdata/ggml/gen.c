// gen writes the Q4_K and F16 test vectors of gpu/q4k/testdata/ggml from
// GGML's own reference functions (quantize_row_q4_K_ref,
// dequantize_row_q4_K, GGML_FP32_TO_FP16). It is our code; GGML's is linked
// in from a checkout (see README.md), never copied into this repository.
//
//	gcc -O2 -std=gnu11 -I$GGML/include -I$GGML/src gen.c $GGML/src/ggml-quants.c -lm -o gen
//	./gen            # writes the files into the current directory
//	./gen -q IN OUT  # quantizes the float32 rows of IN with GGML into OUT
//
// Every input comes from one splitmix64 stream, so the files are the same
// on every run; inputs are stored as they are drawn, so nothing depends on
// this machine's libm matching Go's.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-common.h"
#include "ggml-impl.h"
#include "ggml-quants.h"

// The four symbols ggml-quants.c links against; the Q4_K paths never
// call them.
void ggml_abort(const char *file, int line, const char *fmt, ...) {
	fprintf(stderr, "ggml_abort %s:%d %s\n", file, line, fmt);
	abort();
}
size_t ggml_row_size(enum ggml_type t, int64_t n) { (void)t; (void)n; abort(); }
const char *ggml_type_name(enum ggml_type t) { (void)t; return "?"; }
size_t ggml_type_size(enum ggml_type t) { (void)t; abort(); }

#define QK 256

static uint64_t state = 0x243F6A8885A308D3ull;

static uint64_t next(void) {
	uint64_t z = (state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

// uniform in [0, 1), 53 bits
static double uni(void) { return (double)(next() >> 11) * 0x1.0p-53; }

static double gauss(void) {
	double u = uni(), v = uni();
	return sqrt(-2 * log(1 - u)) * cos(2 * M_PI * v);
}

static void put(FILE *f, const void *p, size_t n) {
	if (fwrite(p, 1, n, f) != n) {
		perror("write");
		exit(1);
	}
}

static FILE *create(const char *name) {
	FILE *f = fopen(name, "wb");
	if (!f) {
		perror(name);
		exit(1);
	}
	return f;
}

// One row of QK weights per case; names go to q4k-cases.txt in order.
static int fill(int c, float *x, const char **name) {
	int i;
	switch (c) {
	case 0: *name = "gaussian"; for (i = 0; i < QK; i++) x[i] = gauss(); return 1;
	case 1: *name = "zero"; for (i = 0; i < QK; i++) x[i] = 0; return 1;
	case 2: *name = "constant"; for (i = 0; i < QK; i++) x[i] = 0.37f; return 1;
	case 3: *name = "negative-constant"; for (i = 0; i < QK; i++) x[i] = -2.5f; return 1;
	case 4: *name = "tiny"; for (i = 0; i < QK; i++) x[i] = 1e-6 * gauss(); return 1;
	case 5: *name = "huge"; for (i = 0; i < QK; i++) x[i] = 1e4 * gauss(); return 1;
	case 6: *name = "very-huge"; for (i = 0; i < QK; i++) x[i] = 1e6 * gauss(); return 1;
	case 7: *name = "subnormal-d"; for (i = 0; i < QK; i++) x[i] = 1e-4 * gauss(); return 1;
	case 8: *name = "negative"; for (i = 0; i < QK; i++) x[i] = -fabs(gauss()); return 1;
	case 9: *name = "positive"; for (i = 0; i < QK; i++) x[i] = fabs(gauss()); return 1;
	case 10: *name = "outlier"; for (i = 0; i < QK; i++) x[i] = 0.1 * gauss(); x[77] = 50; return 1;
	case 11: *name = "outliers-both-signs"; for (i = 0; i < QK; i++) x[i] = 0.02 * gauss(); x[3] = -80; x[200] = 120; return 1;
	case 12: *name = "ramp"; for (i = 0; i < QK; i++) x[i] = -1 + 2.0f * i / QK; return 1;
	case 13: *name = "uniform"; for (i = 0; i < QK; i++) x[i] = 2 * uni() - 1; return 1;
	case 14: *name = "mixed-scale"; for (i = 0; i < QK; i++) x[i] = pow(10, i / 32 - 4) * gauss(); return 1;
	case 15: *name = "sparse"; for (i = 0; i < QK; i++) x[i] = 0; for (i = 0; i < 8; i++) x[next() % QK] = gauss(); return 1;
	case 16: *name = "one-sub-block"; for (i = 0; i < QK; i++) x[i] = i >= 96 && i < 128 ? gauss() : 0; return 1;
	case 17: *name = "alternating"; for (i = 0; i < QK; i++) x[i] = i & 1 ? -1 : 1; return 1;
	case 18: *name = "heavy-tailed"; for (i = 0; i < QK; i++) x[i] = gauss() / sqrt(uni() + 1e-3); return 1;
	case 19: *name = "small-integers"; for (i = 0; i < QK; i++) x[i] = (float)(int)(next() % 16) - 8; return 1;
	case 20: *name = "f16-values"; for (i = 0; i < QK; i++) x[i] = GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(gauss())); return 1;
	case 21: *name = "bf16-values"; for (i = 0; i < QK; i++) { float f = 0.02 * gauss(); uint32_t u; memcpy(&u, &f, 4); u &= 0xFFFF0000u; memcpy(&x[i], &u, 4); } return 1;
	}
	if (c < 22 + 16) {
		// Typical trained weights: sigma 0.02, a few at 4 sigma.
		*name = "weights";
		for (i = 0; i < QK; i++) x[i] = 0.02 * gauss() * (next() % 64 == 0 ? 4 : 1);
		return 1;
	}
	return 0;
}

static void quantizeFile(const char *in, const char *out) {
	FILE *f = fopen(in, "rb");
	if (!f) {
		perror(in);
		exit(1);
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f) / 4 / QK;
	fseek(f, 0, SEEK_SET);
	float *x = malloc(n * QK * 4);
	block_q4_K *y = malloc(n * sizeof(block_q4_K));
	if (fread(x, 4, n * QK, f) != (size_t)(n * QK)) {
		perror(in);
		exit(1);
	}
	quantize_row_q4_K_ref(x, y, n * QK);
	FILE *o = create(out);
	put(o, y, n * sizeof(block_q4_K));
	fclose(o);
}

int main(int argc, char **argv) {
	if (argc == 4 && !strcmp(argv[1], "-q")) {
		quantizeFile(argv[2], argv[3]);
		return 0;
	}
	_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K is 144 bytes");

	// Rows quantized with GGML, and what GGML dequantizes them to.
	FILE *fin = create("q4k-inputs.f32"), *fq = create("q4k-ggml.bin"),
	     *fd = create("q4k-ggml-dequant.f32"), *fn = create("q4k-cases.txt");
	float x[QK], y[QK];
	block_q4_K b;
	const char *name;
	for (int c = 0; fill(c, x, &name); c++) {
		quantize_row_q4_K_ref(x, &b, QK);
		dequantize_row_q4_K(&b, y, QK);
		put(fin, x, sizeof x);
		put(fq, &b, sizeof b);
		put(fd, y, sizeof y);
		fprintf(fn, "%s\n", name);
	}
	fclose(fin), fclose(fq), fclose(fd), fclose(fn);

	// Arbitrary blocks (any bytes: subnormal, huge, infinite and NaN
	// scales included) and what GGML dequantizes them to.
	FILE *fr = create("q4k-random-blocks.bin"), *frd = create("q4k-random-dequant.f32");
	for (int k = 0; k < 48; k++) {
		uint8_t raw[144];
		for (int i = 0; i < 144; i++) raw[i] = next();
		switch (k % 4) {
		case 1: raw[1] &= 0x03, raw[3] &= 0x03; break;   // subnormal d, dmin
		case 2: raw[1] = 0x3c ^ (raw[1] & 0x83), raw[3] = 0x2c ^ (raw[3] & 0x83); break; // near 1 and 1/16
		}
		memcpy(&b, raw, 144);
		dequantize_row_q4_K(&b, y, QK);
		put(fr, raw, 144);
		put(frd, y, sizeof y);
	}
	fclose(fr), fclose(frd);

	// GGML_FP32_TO_FP16 around the values where rounding decides: each
	// sampled f16's neighbour midpoint, one float32 ulp either side of it,
	// and the edges (largest finite, overflow, subnormals, zero).
	FILE *hi = create("f16-inputs.f32"), *ho = create("f16-ggml.bin");
	for (int k = 0; k < 1024; k++) {
		uint16_t h = next() & 0x7BFF; // finite, below the largest exponent's top
		if (k < 16) h = k;            // the smallest subnormals
		float lo = GGML_FP16_TO_FP32(h), up = GGML_FP16_TO_FP32(h + 1);
		float mid = (float)(((double)lo + (double)up) / 2);
		float v[4] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), lo};
		for (int i = 0; i < 4; i++) {
			for (int s = 0; s < 2; s++) {
				float f = s ? -v[i] : v[i];
				uint16_t o = GGML_FP32_TO_FP16(f);
				put(hi, &f, 4);
				put(ho, &o, 2);
			}
		}
	}
	float edges[] = {65504, 65519.996f, 65520, 1e6f, INFINITY, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1p-26f, 1e-30f, 0, 1.0f / 3};
	for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) {
		for (int s = 0; s < 2; s++) {
			float f = s ? -edges[i] : edges[i];
			uint16_t o = GGML_FP32_TO_FP16(f);
			put(hi, &f, 4);
			put(ho, &o, 2);
		}
	}
	fclose(hi), fclose(ho);
	return 0;
}
