"""The browser runtime: the JavaScript API's Python side, its ES module and page (``kvckpt serve`` serves them)."""
