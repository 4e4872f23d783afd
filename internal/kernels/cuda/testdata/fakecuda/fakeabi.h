// fakeabi.h: what the fake cuBLAS (fakecublas.cc) needs of the fake
// driver's streams (fakecuda.cc) to queue its products in stream order.
//
// A fake CUstream points at a bkfake_stream of the driver that made it.
// The hook travels with the stream rather than as an export found with
// dlsym(RTLD_DEFAULT, ...): the backend dlopens the driver RTLD_LOCAL,
// which keeps its symbols out of the global scope, and a test binary loads
// two fake drivers (the full one and noprimary/), each with streams and
// captures of its own.
#pragma once

#include <stddef.h>

struct bkfake_stream {
  // enqueue runs fn(arg) in the stream's order. Streams are synchronous,
  // so that is now, unless the stream is capturing: then fn becomes a node
  // of the graph, with its own copy of the argBytes bytes at arg taken now,
  // which every launch of the graph runs fn on. 0, or a CUresult.
  int (*enqueue)(void* stream, void (*fn)(const void* arg), const void* arg, size_t argBytes);
  // capturing: the stream is capturing (a real cuBLAS must not allocate then).
  int (*capturing)(void* stream);
};
