package image

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// ChartDir is the Helm chart, relative to the repository root; its values
// name the image that deploy/kubernetes/axon.yaml (rendered from it) uses.
const ChartDir = "deploy/helm/axon"

// ChartImage reads the image reference the chart in chartDir renders by
// default: image.repository of values.yaml, and appVersion of Chart.yaml (the
// tag when image.tag and image.digest are empty). hack/image names the image
// after it, so the tarball `make image` writes is the image the manifest runs.
func ChartImage(chartDir string) (repository, tag string, err error) {
	var values struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
			Digest     string `json:"digest"`
		} `json:"image"`
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	for _, f := range []struct {
		file string
		into any
	}{{"values.yaml", &values}, {"Chart.yaml", &chart}} {
		b, err := os.ReadFile(filepath.Join(chartDir, f.file))
		if err != nil {
			return "", "", fmt.Errorf("chart image: %w", err)
		}
		if err := yaml.Unmarshal(b, f.into); err != nil {
			return "", "", fmt.Errorf("chart image: parse %s: %w", filepath.Join(chartDir, f.file), err)
		}
	}
	repository, tag = values.Image.Repository, values.Image.Tag
	if tag == "" {
		tag = chart.AppVersion
	}
	if repository == "" || tag == "" || values.Image.Digest != "" {
		return "", "", fmt.Errorf("chart image in %s: want image.repository and a tag (image.tag or appVersion) and no default image.digest, got %q %q %q",
			chartDir, repository, tag, values.Image.Digest)
	}
	return repository, tag, nil
}
