"""The exercise files: each holds the function(s) a student writes, reference bodies between solution markers."""
