"""The model fuzzer (tools/fuzz/model_fuzz.py is its command line): seeds.py (tiny runnable
GGUF models), gguf_doc.py (a GGUF as editable data and its serializer), mutate.py (the
mutations and the cases), harness.py (running cases in worker subprocesses, classifying
outcomes, the driver and its summary)."""
