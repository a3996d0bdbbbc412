// kstatus-check: reads one Kubernetes object as JSON on stdin and prints the verdict of kstatus
// (sigs.k8s.io/cli-utils/pkg/kstatus, the library Flux's health checks and kapply use) as JSON:
// {"status": "Current|InProgress|Failed|Terminating|NotFound|Unknown", "message": "..."}.
// Built by e2e/build_kstatus.sh; tests/operator/test_op_gitops_health.py runs it on recorded objects.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(data); err != nil { // integers as int64, as kstatus expects
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	result, err := status.Compute(obj)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out := map[string]string{"status": result.Status.String(), "message": result.Message}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
