// Package bundled carries the default model inside the binary, so that
// `baton serve` works with no --model on a machine that has nothing else.
package bundled

import _ "embed"

// Stories260K is Andrej Karpathy's stories260K (MIT licence, see LICENSE.md
// beside this file): a 260K-parameter Llama trained on TinyStories, as GGUF.
//
//go:embed stories260K.gguf
var Stories260K []byte

// Name is the served model name of the bundled model.
const Name = "stories260K"
