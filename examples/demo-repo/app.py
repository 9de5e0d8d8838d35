"""A tiny greeting module. It has a bug: greet() never uses its argument."""


def greet(name):
    return "Hello, name!"
