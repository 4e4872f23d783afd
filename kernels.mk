# kernels.mk: the CUDA kernels and the GPU test kit (included by the Makefile).
#
#   make kernels        rebuild internal/kernels/cuda/kernels.fatbin (sm_80, sm_90
#                       and compute_90 PTX) and kernels.sha256, the stamp of the
#                       sources it was built from; commit both. Needs nvcc (CUDA
#                       11.8+; Debian: nvidia-cuda-toolkit from non-free).
#   make kernels-check  fail when the sources differ from the stamp (no nvcc needed;
#                       the same check runs in go test ./internal/kernels/cuda).
#   make gpu-test-bins  build what test/gpu/run.sh needs into test/gpu/bin/ on a
#                       machine with Go (no GPU, no CUDA toolkit), and pack it
#                       with the libraries it links into test/gpu/kit.tar.xz.

GO           ?= go
NVCC         ?= nvcc
CUDA_PKG     := internal/kernels/cuda
CUDA_SRC     := $(CUDA_PKG)/kernels
CUDA_SOURCES := $(sort $(wildcard $(CUDA_SRC)/*.cu $(CUDA_SRC)/*.cuh))
# -compress-all: the driver unpacks the fatbin when it loads it; the
# embedded copy, in every binary of the GPU test kit, is half the size.
NVCC_FLAGS   ?= -O3 -std=c++14 -Xfatbin -compress-all \
	-gencode arch=compute_80,code=sm_80 \
	-gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90

# The stamp: sha256 of `sha256sum` over the .cu/.cuh files in byte order of
# their names ("<hex>  <name>" lines), as kernelSourceHash in the Go test.
CUDA_STAMP = cd $(CUDA_SRC) && printf '%s\n' *.cu *.cuh | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1

.PHONY: kernels kernels-check gpu-test-bins

kernels: $(CUDA_SOURCES)
	$(NVCC) -fatbin $(NVCC_FLAGS) -o $(CUDA_PKG)/kernels.fatbin $(CUDA_SRC)/baton.cu
	$(CUDA_STAMP) > ../kernels.sha256
	@echo "built $(CUDA_PKG)/kernels.fatbin ($$(wc -c < $(CUDA_PKG)/kernels.fatbin) bytes), stamp $$(cat $(CUDA_PKG)/kernels.sha256)"

kernels-check:
	@want=$$(cat $(CUDA_PKG)/kernels.sha256); have=$$($(CUDA_STAMP)); \
	if [ "$$want" != "$$have" ]; then echo "kernel sources changed since kernels.fatbin was built ($$have, stamp $$want): run make kernels"; exit 1; fi

# Stripped, then packed with the shared libraries baton links that a GPU
# machine may lack (OpenBLAS and what it needs) into test/gpu/kit.tar.xz:
# the one file a device run carries (test/gpu/run.sh unpacks it), a third
# of the binaries' size.
GPU_KIT_LIBS := libopenblas.so.0 libgfortran.so.5 libquadmath.so.0

gpu-test-bins:
	mkdir -p test/gpu/bin test/gpu/lib
	$(GO) build -ldflags "-s -w" -o test/gpu/bin/baton ./cmd/baton
	$(GO) test -c -ldflags "-s -w" -o test/gpu/bin/cuda.test ./$(CUDA_PKG)
	$(GO) test -c -ldflags "-s -w" -o test/gpu/bin/gpu.test ./test/gpu
	$(GO) test -c -ldflags "-s -w" -o test/gpu/bin/e2e.test ./test/e2e
	for l in $(GPU_KIT_LIBS); do \
		p=$$(ldd test/gpu/bin/baton | awk -v l=$$l '$$1 == l { print $$3 }'); \
		[ -n "$$p" ] && cp -L "$$p" test/gpu/lib/$$l || true; \
	done
	tar -C test/gpu -cf - bin lib | xz -T0 -6 > test/gpu/kit.tar.xz
	@ls -l test/gpu/bin test/gpu/lib test/gpu/kit.tar.xz
