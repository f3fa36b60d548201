"""Everything bound to Ray Serve: the deployments, the Classifier and Preprocessor replicas, the handles that adapt
Serve's calls and failures to the pipeline, the metrics, and the one module that reads Serve's private API."""
