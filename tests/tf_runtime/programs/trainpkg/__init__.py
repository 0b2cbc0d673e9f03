"""A trainer laid out as a package (`python -m trainpkg.task`, as cloud ML trainers are):
the entry module imports its model and input modules relatively."""
