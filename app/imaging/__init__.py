"""Images: format probes from the header, decode cost and budget, decoding and conversion, the model's declared
geometry, and the pixels handed to the Classifiers. No Ray, no Starlette."""
