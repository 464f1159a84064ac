"""The browser suite, a package so that its Playwright fixtures (package scope) end with its last test."""
