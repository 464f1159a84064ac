"""The browser runtime: the JavaScript API's Python side and the local server of the page."""
