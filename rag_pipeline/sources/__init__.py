"""Where books come from: the book source contract and its folder implementation (crawling,
change detection by git's rules, file-system notifications)."""
