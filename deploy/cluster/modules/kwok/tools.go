//go:build tools

// Package tools pins the commands this module builds; the build tag keeps it
// out of every build.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
