package main

import (
	_ "github.com/dlclark/regexp2"
	_ "github.com/nikolalohinski/gonja/v2"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/schollz/progressbar/v3"
	_ "github.com/spf13/cobra"
	_ "github.com/zeebo/xxh3"
	_ "golang.org/x/sys/unix"
)

func main() {}
